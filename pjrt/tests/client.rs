//! Property: client and device queries describe the plugin's real devices
//! consistently (ids unique and found again by lookup, every device
//! addressable in a single process, memories attached).

mod common;

use common::{client, plugin};
use tessel_pjrt::{Client, ClientOptions, Value};

#[test]
fn plugin_reports_version_and_attributes() {
    let p = plugin();
    let (major, minor) = p.api_version();
    assert_eq!(major, 0);
    assert!(minor >= tessel_pjrt::MIN_API_MINOR);
    let attrs = p.attributes().unwrap();
    let names: Vec<&str> = attrs.iter().map(|a| a.name.as_str()).collect();
    for want in [
        "xla_version",
        "stablehlo_current_version",
        "stablehlo_minimum_version",
    ] {
        assert!(names.contains(&want), "missing {want} in {names:?}");
    }
    let current = attrs
        .iter()
        .find(|a| a.name == "stablehlo_current_version")
        .unwrap();
    assert!(matches!(&current.value, Value::Int64List(v) if v.len() == 3));
}

#[test]
fn loading_twice_returns_the_same_library() {
    let a = plugin();
    let b = plugin();
    assert!(a.same_as(&b));
}

#[test]
fn devices_are_consistent() {
    let c = client(4);
    assert_eq!(c.platform_name().unwrap(), "cpu");
    assert!(!c.platform_version().unwrap().is_empty());
    assert_eq!(c.process_index().unwrap(), 0);
    let all = c.devices().unwrap();
    let local = c.addressable_devices().unwrap();
    assert_eq!(all.len(), 4);
    assert_eq!(all, local, "a single-process client addresses every device");
    let mut ids = Vec::new();
    for (i, d) in local.iter().enumerate() {
        let id = d.id().unwrap();
        ids.push(id);
        assert_eq!(c.lookup_device(id).unwrap(), *d);
        assert_eq!(d.process_index().unwrap(), 0);
        assert_eq!(d.local_hardware_id().unwrap(), i as i32);
        assert!(d.is_addressable().unwrap());
        assert_eq!(d.kind().unwrap(), "cpu");
        assert!(!d.debug_string().unwrap().is_empty());
        assert!(!d.to_display_string().unwrap().is_empty());
        d.attributes().unwrap();
        // CPU plugins report no limit (UNIMPLEMENTED or unset); the call
        // itself must work on every build.
        if let Some(limit) = d.memory_limit().unwrap() {
            assert!(limit > 0);
        }
        let mems = d.memories().unwrap();
        let default = d.default_memory().unwrap();
        assert!(mems
            .iter()
            .any(|m| m.id().unwrap() == default.id().unwrap()));
        assert!(!default.kind().unwrap().is_empty());
        assert!(!default.debug_string().unwrap().is_empty());
    }
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 4, "device ids are unique");
    assert!(c.addressable_memories().unwrap().len() >= 4);
}

#[test]
fn default_device_assignment_covers_distinct_devices() {
    let c = client(4);
    let da = c.default_device_assignment(2, 2).unwrap();
    assert_eq!(da.len(), 2);
    let mut flat: Vec<i32> = da.concat();
    flat.sort_unstable();
    assert_eq!(flat, vec![0, 1, 2, 3]);
}

#[test]
fn clients_are_independent_and_outlive_nothing_they_made() {
    let c = client(2);
    let dev = c.addressable_devices().unwrap().remove(1);
    let buf = c.buffer_from_slice(&[3u16, 4], &[2], &dev).unwrap();
    drop(c);
    // The buffer keeps its client alive.
    assert_eq!(
        buf.to_host_blocking().unwrap().to_vec::<u16>().unwrap(),
        vec![3, 4]
    );
    assert_eq!(buf.device().unwrap().client().devices().unwrap().len(), 2);
}

#[test]
fn create_options_of_every_kind_reach_the_plugin_intact() {
    // An int64 the plugin reads: the device count.
    let c = Client::create(
        &plugin(),
        ClientOptions::default().option("cpu_device_count", 3i64),
    )
    .unwrap();
    assert_eq!(c.devices().unwrap().len(), 3);
    // Option names the plugin does not know: API 0.81 ignores them, newer
    // builds reject them naming the option — either way the name and each
    // value kind cross the boundary intact.
    let kinds: [(&str, Value); 5] = [
        ("tessel_string", "x".into()),
        ("tessel_int", 7i64.into()),
        ("tessel_list", vec![1i64, 2, 3].into()),
        ("tessel_float", 0.5f32.into()),
        ("tessel_bool", true.into()),
    ];
    for (name, value) in kinds {
        let opts = ClientOptions::default()
            .option("cpu_device_count", 2i64)
            .option(name, value);
        match Client::create(&plugin(), opts) {
            Ok(c) => assert_eq!(c.devices().unwrap().len(), 2),
            Err(e) => {
                assert_eq!(e.code(), tessel_pjrt::ErrorCode::InvalidArgument, "{e}");
                assert!(e.to_string().contains(name), "{e}");
            }
        }
    }
}
