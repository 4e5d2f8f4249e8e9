//! The naming rule for anything a worker turns into a path: a name it
//! accepts, joined to a folder, is one normal component inside it.
#![no_main]
use libfuzzer_sys::fuzz_target;
use std::path::{Component, Path};

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else { return };
    if tessel::names::check("name", s).is_ok() {
        let joined = tessel::names::confined(Path::new("/root/dir"), "name", s).unwrap();
        assert!(joined.starts_with("/root/dir"));
        let extra: Vec<Component> = joined.strip_prefix("/root/dir").unwrap().components().collect();
        assert!(matches!(extra.as_slice(), [Component::Normal(_)]), "{s:?}");
    }
    let _ = tessel::names::check_relative("file", Path::new(s));
});
