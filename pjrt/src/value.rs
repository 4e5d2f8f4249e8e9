//! Named values: plugin attributes, device attributes and create options.

use std::ffi::c_char;

use crate::ffi;
use crate::plugin::bytes_to_string;

/// A value of a `PJRT_NamedValue`.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// Text.
    String(String),
    /// A 64-bit integer.
    Int64(i64),
    /// A list of 64-bit integers.
    Int64List(Vec<i64>),
    /// A 32-bit float.
    Float(f32),
    /// A boolean.
    Bool(bool),
}

impl std::fmt::Display for Value {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Value::String(s) => f.write_str(s),
            Value::Int64(v) => write!(f, "{v}"),
            Value::Int64List(v) => write!(f, "{v:?}"),
            Value::Float(v) => write!(f, "{v}"),
            Value::Bool(v) => write!(f, "{v}"),
        }
    }
}

macro_rules! value_from {
    ($($t:ty => $variant:ident $(($conv:expr))?),*) => {$(
        impl From<$t> for Value {
            fn from(v: $t) -> Self { Value::$variant($( $conv )?(v)) }
        }
    )*};
}
value_from!(
    String => String,
    &str => String (str::to_owned),
    i64 => Int64,
    Vec<i64> => Int64List,
    f32 => Float,
    bool => Bool
);

/// A name and a value.
#[derive(Debug, Clone, PartialEq)]
pub struct NamedValue {
    /// The option's name.
    pub name: String,
    /// Its value.
    pub value: Value,
}

impl NamedValue {
    /// A named value.
    pub fn new(name: impl Into<String>, value: impl Into<Value>) -> Self {
        NamedValue {
            name: name.into(),
            value: value.into(),
        }
    }
}

/// Copies `n` named values out of plugin memory.
///
/// # Safety
/// `ptr` must point to `n` valid `PJRT_NamedValue`s (or be null with n = 0),
/// whose strings and lists are valid for their stated sizes.
pub(crate) unsafe fn read_named_values(
    ptr: *const ffi::PJRT_NamedValue,
    n: usize,
) -> Vec<NamedValue> {
    if ptr.is_null() || n == 0 {
        return Vec::new();
    }
    // SAFETY: guaranteed by the caller.
    let raw = unsafe { std::slice::from_raw_parts(ptr, n) };
    raw.iter()
        .map(|nv| {
            // SAFETY: name is valid for name_size bytes (caller's guarantee);
            // the union member read matches the declared type tag.
            unsafe {
                let name = bytes_to_string(nv.name, nv.name_size);
                let value = match nv.type_ {
                    ffi::PJRT_NamedValue_kString => {
                        Value::String(bytes_to_string(nv.value.string_value, nv.value_size))
                    }
                    ffi::PJRT_NamedValue_kInt64 => Value::Int64(nv.value.int64_value),
                    ffi::PJRT_NamedValue_kInt64List => {
                        let p = nv.value.int64_array_value;
                        if p.is_null() || nv.value_size == 0 {
                            Value::Int64List(Vec::new())
                        } else {
                            Value::Int64List(std::slice::from_raw_parts(p, nv.value_size).to_vec())
                        }
                    }
                    ffi::PJRT_NamedValue_kFloat => Value::Float(nv.value.float_value),
                    ffi::PJRT_NamedValue_kBool => Value::Bool(nv.value.bool_value),
                    other => Value::String(format!("<unknown named value type {other}>")),
                };
                NamedValue { name, value }
            }
        })
        .collect()
}

/// Named values laid out for a C call. The raw structs point into `values`,
/// whose heap storage does not move when this struct does.
pub(crate) struct RawNamedValues {
    raw: Vec<ffi::PJRT_NamedValue>,
    _values: Vec<NamedValue>,
}

impl RawNamedValues {
    pub(crate) fn new(values: &[NamedValue]) -> Self {
        let values = values.to_vec();
        let raw = values
            .iter()
            .map(|nv| {
                let mut r = ffi::PJRT_NamedValue::new();
                r.name = nv.name.as_ptr().cast::<c_char>();
                r.name_size = nv.name.len();
                match &nv.value {
                    Value::String(s) => {
                        r.type_ = ffi::PJRT_NamedValue_kString;
                        r.value.string_value = s.as_ptr().cast::<c_char>();
                        r.value_size = s.len();
                    }
                    Value::Int64(v) => {
                        r.type_ = ffi::PJRT_NamedValue_kInt64;
                        r.value.int64_value = *v;
                        r.value_size = 1;
                    }
                    Value::Int64List(v) => {
                        r.type_ = ffi::PJRT_NamedValue_kInt64List;
                        r.value.int64_array_value = v.as_ptr();
                        r.value_size = v.len();
                    }
                    Value::Float(v) => {
                        r.type_ = ffi::PJRT_NamedValue_kFloat;
                        r.value.float_value = *v;
                        r.value_size = 1;
                    }
                    Value::Bool(v) => {
                        r.type_ = ffi::PJRT_NamedValue_kBool;
                        r.value.bool_value = *v;
                        r.value_size = 1;
                    }
                }
                r
            })
            .collect();
        RawNamedValues {
            raw,
            _values: values,
        }
    }

    pub(crate) fn as_ptr(&self) -> *const ffi::PJRT_NamedValue {
        self.raw.as_ptr()
    }

    pub(crate) fn len(&self) -> usize {
        self.raw.len()
    }
}
