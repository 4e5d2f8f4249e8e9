//! Host arrays at the edges: inline literals (`f32[2,2]=1,2,3,4`), `.npy`
//! files, and printing.
//!
//! Everything here parses untrusted input: sizes are checked before any
//! allocation, and every failure is an [`ArrayError`] that says what is
//! wrong. `fuzz/` has a target for each decoder.

use half::{bf16, f16};
use tessel_pjrt::{ElementType, HostBuffer, NativeType};

/// The largest array a literal or `.npy` file may describe (4 GiB).
pub const MAX_ARRAY_BYTES: usize = 4 << 30;
/// The largest array a job's spec or program may declare, whole (1 TiB;
/// `job` invariant 8): far past any host, small enough that every size
/// derived from it fits.
pub const MAX_JOB_ARRAY_BYTES: usize = 1 << 40;
/// The largest `.npy` header accepted.
const MAX_NPY_HEADER: usize = 64 << 10;

/// Why an array could not be read or written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArrayError {
    /// A literal array does not parse.
    #[error("bad array literal `{literal}`: {reason}")]
    Literal {
        /// The literal.
        literal: String,
        /// Why.
        reason: String,
    },
    /// A `.npy` file does not decode.
    #[error("bad .npy data: {0}")]
    Npy(String),
    /// An element type tessel does not know.
    #[error("unknown element type `{0}` (expected one of pred, s8, s16, s32, s64, u8, u16, u32, u64, f16, bf16, f32, f64)")]
    UnknownType(String),
}

fn literal_err(literal: &str, reason: impl Into<String>) -> ArrayError {
    let literal = if literal.len() > 80 {
        format!(
            "{}…",
            &literal[..literal
                .char_indices()
                .nth(77)
                .map_or(literal.len(), |(i, _)| i)]
        )
    } else {
        literal.to_owned()
    };
    ArrayError::Literal {
        literal,
        reason: reason.into(),
    }
}

/// Number of elements and bytes of a shape, refusing overflow and
/// anything above `max_bytes`.
pub(crate) fn checked_size(
    ty: ElementType,
    dims: &[i64],
    max_bytes: usize,
) -> Result<(usize, usize), String> {
    let mut n: usize = 1;
    for &d in dims {
        let d = usize::try_from(d).map_err(|_| format!("negative dimension {d}"))?;
        n = n.checked_mul(d).ok_or("shape overflows")?;
    }
    let bytes = n.checked_mul(ty.size()).ok_or("shape overflows")?;
    if bytes > max_bytes {
        return Err(format!("{bytes} bytes exceeds the {max_bytes}-byte limit"));
    }
    Ok((n, bytes))
}

/// Parses `TYPE[D0,D1,...]=V0,V1,...`. A scalar is `f32[]=1.5` or
/// `f32=1.5`; a single value fills the whole shape (`f32[1000]=0`).
/// `pred` accepts `true`/`false`/`1`/`0`; float types accept `nan`, `inf`.
pub fn parse_literal(spec: &str) -> Result<HostBuffer, ArrayError> {
    let (ty_shape, values) = spec
        .split_once('=')
        .ok_or_else(|| literal_err(spec, "expected TYPE[DIMS]=VALUES, e.g. f32[2,2]=1,2,3,4"))?;
    let ty_shape = ty_shape.trim();
    let (ty_name, dims) = match ty_shape.split_once('[') {
        Some((t, rest)) => {
            let inner = rest
                .strip_suffix(']')
                .ok_or_else(|| literal_err(spec, "missing `]` after the dimensions"))?;
            let dims = if inner.trim().is_empty() {
                Vec::new()
            } else {
                inner
                    .split(',')
                    .map(|d| {
                        d.trim()
                            .parse::<i64>()
                            .map_err(|_| literal_err(spec, format!("bad dimension `{}`", d.trim())))
                    })
                    .collect::<Result<Vec<_>, _>>()?
            };
            (t.trim(), dims)
        }
        None => (ty_shape, Vec::new()),
    };
    let ty =
        ElementType::parse(ty_name).ok_or_else(|| ArrayError::UnknownType(ty_name.to_owned()))?;
    let (count, _) = checked_size(ty, &dims, MAX_ARRAY_BYTES).map_err(|r| literal_err(spec, r))?;
    let raw: Vec<&str> = values.split(',').map(str::trim).collect();
    if raw.len() != count && raw.len() != 1 {
        return Err(literal_err(
            spec,
            format!(
                "shape {dims:?} has {count} elements but {} values were given",
                raw.len()
            ),
        ));
    }
    let mut bytes = Vec::with_capacity(count * ty.size());
    let encoded: Vec<Vec<u8>> = raw
        .iter()
        .map(|v| encode_value(ty, v).map_err(|r| literal_err(spec, r)))
        .collect::<Result<_, _>>()?;
    if encoded.len() == 1 {
        for _ in 0..count {
            bytes.extend_from_slice(&encoded[0]);
        }
    } else {
        encoded.iter().for_each(|e| bytes.extend_from_slice(e));
    }
    HostBuffer::from_bytes(ty, &dims, bytes).map_err(|e| literal_err(spec, e.to_string()))
}

fn encode_value(ty: ElementType, v: &str) -> Result<Vec<u8>, String> {
    fn int<T: std::str::FromStr + NativeType>(v: &str) -> Result<Vec<u8>, String> {
        let x: T = v
            .parse()
            .map_err(|_| format!("`{v}` is not a valid {}", T::TYPE))?;
        Ok(T::as_bytes(&[x]).to_vec())
    }
    fn float(v: &str) -> Result<f64, String> {
        v.parse::<f64>()
            .map_err(|_| format!("`{v}` is not a number"))
    }
    use ElementType::*;
    match ty {
        Pred => match v {
            "true" | "1" => Ok(vec![1]),
            "false" | "0" => Ok(vec![0]),
            _ => Err(format!("`{v}` is not a pred (true/false/1/0)")),
        },
        S8 => int::<i8>(v),
        S16 => int::<i16>(v),
        S32 => int::<i32>(v),
        S64 => int::<i64>(v),
        U8 => int::<u8>(v),
        U16 => int::<u16>(v),
        U32 => int::<u32>(v),
        U64 => int::<u64>(v),
        F16 => Ok(f16::from_f64(float(v)?).to_le_bytes().to_vec()),
        BF16 => Ok(bf16::from_f64(float(v)?).to_le_bytes().to_vec()),
        F32 => Ok((float(v)? as f32).to_le_bytes().to_vec()),
        F64 => Ok(float(v)?.to_le_bytes().to_vec()),
    }
}

/// numpy's `descr` for a type; bf16 has none and is refused.
fn npy_descr(ty: ElementType) -> Option<&'static str> {
    use ElementType::*;
    Some(match ty {
        Pred => "|b1",
        S8 => "|i1",
        S16 => "<i2",
        S32 => "<i4",
        S64 => "<i8",
        U8 => "|u1",
        U16 => "<u2",
        U32 => "<u4",
        U64 => "<u8",
        F16 => "<f2",
        F32 => "<f4",
        F64 => "<f8",
        BF16 => return None,
    })
}

fn type_of_descr(descr: &str) -> Result<(ElementType, bool), ArrayError> {
    let unsupported = || ArrayError::Npy(format!("unsupported dtype descr `{descr}`"));
    let mut chars = descr.chars();
    let big_endian = match chars.next() {
        Some('<' | '|' | '=') => false,
        Some('>') => true,
        _ => return Err(unsupported()),
    };
    let code = chars.as_str();
    use ElementType::*;
    let ty = match code {
        "b1" => Pred,
        "i1" => S8,
        "i2" => S16,
        "i4" => S32,
        "i8" => S64,
        "u1" => U8,
        "u2" => U16,
        "u4" => U32,
        "u8" => U64,
        "f2" => F16,
        "f4" => F32,
        "f8" => F64,
        _ => return Err(unsupported()),
    };
    Ok((ty, big_endian))
}

/// Reads a `.npy` file (format 1.0, 2.0 or 3.0; C order; any byte order).
pub fn read_npy(data: &[u8]) -> Result<HostBuffer, ArrayError> {
    let npy = |m: &str| ArrayError::Npy(m.to_owned());
    if data.len() < 10 || &data[..6] != b"\x93NUMPY" {
        return Err(npy("missing the \\x93NUMPY magic"));
    }
    let (header_len, start) = match data[6] {
        1 => (u16::from_le_bytes([data[8], data[9]]) as usize, 10),
        2 | 3 => {
            if data.len() < 12 {
                return Err(npy("truncated header length"));
            }
            (
                u32::from_le_bytes([data[8], data[9], data[10], data[11]]) as usize,
                12,
            )
        }
        v => return Err(ArrayError::Npy(format!("unsupported format version {v}"))),
    };
    if header_len > MAX_NPY_HEADER {
        return Err(ArrayError::Npy(format!(
            "header of {header_len} bytes is too large"
        )));
    }
    let end = start + header_len;
    let header = data
        .get(start..end)
        .ok_or_else(|| npy("truncated header"))?;
    let header = std::str::from_utf8(header).map_err(|_| npy("header is not UTF-8"))?;
    let descr = dict_value(header, "descr").ok_or_else(|| npy("header has no descr"))?;
    let descr = descr.trim().trim_matches(|c| c == '\'' || c == '"');
    let fortran =
        dict_value(header, "fortran_order").ok_or_else(|| npy("header has no fortran_order"))?;
    if fortran.trim() != "False" {
        return Err(npy(
            "Fortran-order arrays are not supported; save with np.ascontiguousarray",
        ));
    }
    let shape = dict_value(header, "shape").ok_or_else(|| npy("header has no shape"))?;
    let shape = shape.trim();
    let inner = shape
        .strip_prefix('(')
        .and_then(|s| s.strip_suffix(')'))
        .ok_or_else(|| ArrayError::Npy(format!("bad shape `{shape}`")))?;
    let dims = inner
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse::<i64>()
                .map_err(|_| ArrayError::Npy(format!("bad dimension `{s}`")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let (ty, big_endian) = type_of_descr(descr)?;
    let (_, nbytes) = checked_size(ty, &dims, MAX_ARRAY_BYTES).map_err(ArrayError::Npy)?;
    let body = &data[end..];
    if body.len() != nbytes {
        return Err(ArrayError::Npy(format!(
            "shape {dims:?} of {} needs {nbytes} bytes of data, file has {}",
            ty,
            body.len()
        )));
    }
    let mut bytes = body.to_vec();
    if big_endian && ty.size() > 1 {
        bytes.chunks_exact_mut(ty.size()).for_each(<[u8]>::reverse);
    }
    HostBuffer::from_bytes(ty, &dims, bytes).map_err(|e| ArrayError::Npy(e.to_string()))
}

/// The text after `'key':` in a Python dict literal, up to the next
/// top-level comma.
fn dict_value<'a>(header: &'a str, key: &str) -> Option<&'a str> {
    let pos = header
        .find(&format!("'{key}'"))
        .or_else(|| header.find(&format!("\"{key}\"")))?;
    let rest = &header[pos + key.len() + 2..];
    let rest = rest.trim_start().strip_prefix(':')?;
    let mut depth = 0i32;
    for (i, c) in rest.char_indices() {
        match c {
            '(' | '[' => depth += 1,
            ')' | ']' => depth -= 1,
            ',' | '}' if depth == 0 => return Some(&rest[..i]),
            _ => {}
        }
    }
    None
}

/// Encodes a `.npy` (format 1.0). bf16 arrays are widened to f32, which is
/// exact, since numpy has no bf16.
pub fn write_npy(array: &HostBuffer) -> Vec<u8> {
    let widened;
    let array = if array.element_type() == ElementType::BF16 {
        let v: Vec<f32> = array
            .to_vec::<bf16>()
            .expect("type checked")
            .into_iter()
            .map(f32::from)
            .collect();
        widened = HostBuffer::from_slice(&v, array.dims()).expect("same shape");
        &widened
    } else {
        array
    };
    let descr = npy_descr(array.element_type()).expect("every type but bf16 has a descr");
    let shape = match array.dims() {
        [] => "()".to_owned(),
        [d] => format!("({d},)"),
        ds => format!(
            "({})",
            ds.iter().map(i64::to_string).collect::<Vec<_>>().join(", ")
        ),
    };
    let mut header = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
    // Pad so the data starts on a 64-byte boundary, ending with a newline.
    let total = 10 + header.len() + 1;
    header.push_str(&" ".repeat((64 - total % 64) % 64));
    header.push('\n');
    let mut out = Vec::with_capacity(10 + header.len() + array.bytes().len());
    out.extend_from_slice(b"\x93NUMPY\x01\x00");
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(array.bytes());
    out
}

/// Element `i` as text.
fn element_text(array: &HostBuffer, i: usize) -> String {
    let size = array.element_type().size();
    let b = &array.bytes()[i * size..(i + 1) * size];
    use ElementType::*;
    match array.element_type() {
        Pred => (b[0] != 0).to_string(),
        S8 => (b[0] as i8).to_string(),
        S16 => i16::from_le_bytes([b[0], b[1]]).to_string(),
        S32 => i32::from_le_bytes(b.try_into().expect("4 bytes")).to_string(),
        S64 => i64::from_le_bytes(b.try_into().expect("8 bytes")).to_string(),
        U8 => b[0].to_string(),
        U16 => u16::from_le_bytes([b[0], b[1]]).to_string(),
        U32 => u32::from_le_bytes(b.try_into().expect("4 bytes")).to_string(),
        U64 => u64::from_le_bytes(b.try_into().expect("8 bytes")).to_string(),
        F16 => f16::from_le_bytes([b[0], b[1]]).to_string(),
        BF16 => bf16::from_le_bytes([b[0], b[1]]).to_string(),
        F32 => f32::from_le_bytes(b.try_into().expect("4 bytes")).to_string(),
        F64 => f64::from_le_bytes(b.try_into().expect("8 bytes")).to_string(),
    }
}

/// Prints an array as nested lists, eliding the middle of long dimensions.
pub fn format_array(array: &HostBuffer) -> String {
    fn rec(a: &HostBuffer, dims: &[usize], offset: usize, out: &mut String) {
        let Some((&n, rest)) = dims.split_first() else {
            out.push_str(&element_text(a, offset));
            return;
        };
        let stride: usize = rest.iter().product();
        out.push('[');
        let shown: Vec<usize> = if n > 8 {
            (0..3).chain(n - 3..n).collect()
        } else {
            (0..n).collect()
        };
        for (k, &i) in shown.iter().enumerate() {
            if k > 0 {
                out.push_str(", ");
                if n > 8 && k == 3 {
                    out.push_str("..., ");
                }
            }
            rec(a, rest, offset + i * stride, out);
        }
        out.push(']');
    }
    let dims: Vec<usize> = array.dims().iter().map(|&d| d as usize).collect();
    let mut out = String::new();
    rec(array, &dims, 0, &mut out);
    out
}

/// Every element as f64 (integers exactly up to 2^53).
pub fn to_f64(a: &HostBuffer) -> Vec<f64> {
    fn conv<T: tessel_pjrt::NativeType + Copy>(a: &HostBuffer, f: impl Fn(T) -> f64) -> Vec<f64> {
        a.to_vec::<T>()
            .expect("type checked")
            .into_iter()
            .map(f)
            .collect()
    }
    match a.element_type() {
        ElementType::Pred | ElementType::U8 => a.bytes().iter().map(|&b| b as f64).collect(),
        ElementType::S8 => a.bytes().iter().map(|&b| b as i8 as f64).collect(),
        ElementType::S16 => conv::<i16>(a, |v| v as f64),
        ElementType::S32 => conv::<i32>(a, |v| v as f64),
        ElementType::S64 => conv::<i64>(a, |v| v as f64),
        ElementType::U16 => conv::<u16>(a, |v| v as f64),
        ElementType::U32 => conv::<u32>(a, |v| v as f64),
        ElementType::U64 => conv::<u64>(a, |v| v as f64),
        ElementType::F16 => conv::<f16>(a, |v| v.to_f64()),
        ElementType::BF16 => conv::<bf16>(a, |v| v.to_f64()),
        ElementType::F32 => conv::<f32>(a, |v| v as f64),
        ElementType::F64 => conv::<f64>(a, |v| v),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literals_of_every_type() {
        let a = parse_literal("f32[2,2]=1,2,3,4").unwrap();
        assert_eq!(a.dims(), &[2, 2]);
        assert_eq!(a.to_vec::<f32>().unwrap(), vec![1., 2., 3., 4.]);
        assert_eq!(
            parse_literal("s64=-7").unwrap().to_vec::<i64>().unwrap(),
            vec![-7]
        );
        assert_eq!(parse_literal("i32[]=5").unwrap().dims(), &[] as &[i64]);
        assert_eq!(
            parse_literal("pred[3]=true,0,1")
                .unwrap()
                .to_vec::<bool>()
                .unwrap(),
            vec![true, false, true]
        );
        assert_eq!(
            parse_literal("u8[4]=255").unwrap().to_vec::<u8>().unwrap(),
            vec![255; 4]
        );
        assert_eq!(
            parse_literal("bf16[2]=1.5,-2")
                .unwrap()
                .to_vec::<bf16>()
                .unwrap(),
            vec![bf16::from_f32(1.5), bf16::from_f32(-2.0)]
        );
        assert!(parse_literal("f64[1]=nan")
            .unwrap()
            .to_vec::<f64>()
            .unwrap()[0]
            .is_nan());
        assert_eq!(parse_literal("f16[0]=0").unwrap().len(), 0);
    }

    #[test]
    fn bad_literals_say_why() {
        for (spec, want) in [
            ("f32[2,2]=1,2,3", "4 elements but 3 values"),
            ("f33[2]=1,2", "unknown element type `f33`"),
            ("f32[2=1,2", "missing `]`"),
            ("f32[a]=1", "bad dimension `a`"),
            ("f32[-1]=1", "negative dimension"),
            ("u8[2]=1,256", "`256` is not a valid u8"),
            ("pred=maybe", "not a pred"),
            ("f32[2]", "expected TYPE[DIMS]=VALUES"),
            ("f32[99999999999,99999999999]=0", "overflows"),
            ("f32[2000000000]=0", "limit"),
        ] {
            let e = parse_literal(spec).unwrap_err().to_string();
            assert!(e.contains(want), "{spec}: {e}");
        }
    }

    #[test]
    fn npy_round_trips_every_numpy_type() {
        for ty in ElementType::ALL {
            if ty == ElementType::BF16 {
                continue;
            }
            let a = HostBuffer::from_bytes(
                ty,
                &[2, 3],
                (0..6 * ty.size() as u8).map(|b| b % 2).collect(),
            )
            .unwrap();
            let back = read_npy(&write_npy(&a)).unwrap();
            assert_eq!(back, a, "{ty}");
        }
        let scalar = HostBuffer::scalar(3.5f64);
        assert_eq!(read_npy(&write_npy(&scalar)).unwrap(), scalar);
        let header_end = write_npy(&scalar).len() - 8;
        assert_eq!(header_end % 64, 0, "data is 64-byte aligned");
    }

    #[test]
    fn bf16_is_written_as_exact_f32() {
        let a =
            HostBuffer::from_slice(&[bf16::from_f32(0.15625), bf16::from_f32(-3.0)], &[2]).unwrap();
        let back = read_npy(&write_npy(&a)).unwrap();
        assert_eq!(back.to_vec::<f32>().unwrap(), vec![0.15625, -3.0]);
    }

    #[test]
    fn npy_from_numpy_with_big_endian_and_version_2() {
        // np.save of np.array([1, 2], dtype='>i4') in format 2.0.
        let header = "{'descr': '>i4', 'fortran_order': False, 'shape': (2,), }\n";
        let mut f = b"\x93NUMPY\x02\x00".to_vec();
        f.extend_from_slice(&(header.len() as u32).to_le_bytes());
        f.extend_from_slice(header.as_bytes());
        f.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 2]);
        assert_eq!(read_npy(&f).unwrap().to_vec::<i32>().unwrap(), vec![1, 2]);
    }

    #[test]
    fn bad_npy_is_refused_without_allocating() {
        let good = write_npy(&HostBuffer::from_slice(&[1f32, 2.0], &[2]).unwrap());
        assert!(read_npy(&good[..good.len() - 1]).is_err(), "truncated data");
        assert!(read_npy(b"\x93NUMPY").is_err());
        assert!(read_npy(b"not an npy file at all").is_err());
        let with_header = |header: &str| {
            let mut f = b"\x93NUMPY\x01\x00".to_vec();
            f.extend_from_slice(&(header.len() as u16).to_le_bytes());
            f.extend_from_slice(header.as_bytes());
            f.extend_from_slice(&[0; 8]);
            read_npy(&f).unwrap_err().to_string()
        };
        let e = with_header(
            "{'descr': '<f4', 'fortran_order': False, 'shape': (4611686018427387904,), }",
        );
        assert!(e.contains("overflows") || e.contains("limit"), "{e}");
        let e = with_header(
            "{'descr': '<f4', 'fortran_order': False, 'shape': (1073741824, 1073741824), }",
        );
        assert!(e.contains("limit"), "{e}");
        assert!(
            with_header("{'descr': '<f4', 'fortran_order': True, 'shape': (2,), }")
                .contains("Fortran")
        );
        assert!(
            with_header("{'descr': '<c8', 'fortran_order': False, 'shape': (1,), }")
                .contains("<c8")
        );
        // Found by the npy fuzz target: a descr starting with a multi-byte
        // character used to panic.
        assert!(
            with_header("{'descr': 'é4', 'fortran_order': False, 'shape': (1,), }").contains("é4")
        );
        assert!(
            with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }")
                .contains("needs 12 bytes")
        );
        assert!(with_header("{'descr': '<f4', 'fortran_order': False, }").contains("no shape"));
        assert!(
            with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (-2,), }")
                .contains("negative")
        );
    }

    #[test]
    fn printing_nests_and_elides() {
        let a = parse_literal("s32[2,3]=1,2,3,4,5,6").unwrap();
        assert_eq!(format_array(&a), "[[1, 2, 3], [4, 5, 6]]");
        let long = HostBuffer::from_slice(&(0..20).collect::<Vec<i32>>(), &[20]).unwrap();
        assert_eq!(format_array(&long), "[0, 1, 2, ..., 17, 18, 19]");
        assert_eq!(format_array(&HostBuffer::scalar(true)), "true");
    }
}
