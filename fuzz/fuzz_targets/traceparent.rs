//! A job's trace context (W3C `traceparent`, read from records and
//! assignments): any text parses or fails cleanly; a parsed one prints back
//! its ids (in lower case) and gives attempt span ids that are never 0.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(t) = tessel_trace::JobTrace::parse(text) {
            assert_eq!(t.to_string()[..53], text.to_ascii_lowercase()[..53]);
            assert_ne!(t.attempt_span(1), opentelemetry::trace::SpanId::INVALID);
        }
    }
});
