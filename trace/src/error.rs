/// What tracing can fail with.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// A `traceparent` that is not W3C's `00-TRACE-SPAN-FLAGS`.
    #[error("`{0}` is not a W3C traceparent (00-<32 hex>-<16 hex>-<2 hex>)")]
    BadTraceparent(String),
    /// The OTLP exporter could not be built from the environment.
    #[error("the OTLP exporter: {0}")]
    Exporter(String),
}
