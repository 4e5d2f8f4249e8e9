//! Reading the signature of a StableHLO module's `@main` from MLIR text:
//! parameter and result tensor types, their sharding annotations (GSPMD's
//! `mhlo.sharding` or Shardy's `sdy.sharding`), Shardy meshes, and the
//! module's replica and partition counts.
//!
//! This is not an MLIR parser: it scans the few constructs it needs and
//! skips everything else, keeping track of brackets and string literals.
//! It never panics on any input (`fuzz/` checks that).

use std::collections::BTreeMap;

use tessel_pjrt::ElementType;

use crate::array::{checked_size, MAX_JOB_ARRAY_BYTES};

/// Why a signature could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MlirError {
    /// The module has no `@main`.
    #[error("no `func.func ... @main(` in the program")]
    NoMain,
    /// Brackets do not balance.
    #[error("unbalanced brackets in the signature of @main")]
    Unbalanced,
    /// Some text does not parse.
    #[error("{what} `{text}`: {reason}")]
    Syntax {
        /// What was parsed.
        what: &'static str,
        /// The text (cut at 80 characters).
        text: String,
        /// Why.
        reason: String,
    },
}

fn syntax(what: &'static str, text: &str, reason: impl Into<String>) -> MlirError {
    let text: String = text.chars().take(80).collect();
    MlirError::Syntax {
        what,
        text,
        reason: reason.into(),
    }
}

/// A ranked tensor type with static dimensions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorType {
    /// The element type.
    pub element_type: ElementType,
    /// The dimensions.
    pub dims: Vec<i64>,
}

impl TensorType {
    /// Bytes of one value of this type.
    pub fn byte_len(&self) -> usize {
        self.dims.iter().product::<i64>().max(0) as usize * self.element_type.size()
    }
}

impl std::fmt::Display for TensorType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}{:?}", self.element_type, self.dims)
    }
}

/// A sharding annotation as written in the program.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ShardingAnnotation {
    /// `mhlo.sharding = "{devices=[4]<=[4]}"` (the string inside the quotes).
    Gspmd(String),
    /// `sdy.sharding = #sdy.sharding<@mesh, [{"x"}, {}]>`: the mesh name and,
    /// per dimension, the mesh axes it is split over.
    Shardy {
        /// The mesh's name.
        mesh: String,
        /// Per dimension, the axes it is split over.
        dims: Vec<Vec<String>>,
    },
}

/// One parameter or result of `@main`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Value {
    /// `%arg0` for parameters, `result 0` for results.
    pub name: String,
    /// Its type.
    pub ty: TensorType,
    /// Its sharding, if annotated.
    pub sharding: Option<ShardingAnnotation>,
    /// A parameter the program lets the runtime reuse for a result
    /// (`tf.aliasing_output` or `jax.buffer_donor = true`).
    pub donated: bool,
}

/// The signature of `@main` and the module attributes around it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Signature {
    /// `@main`'s parameters.
    pub parameters: Vec<Value>,
    /// `@main`'s results.
    pub results: Vec<Value>,
    /// `mhlo.num_replicas`, if set.
    pub num_replicas: Option<usize>,
    /// `mhlo.num_partitions`, if set.
    pub num_partitions: Option<usize>,
    /// Shardy meshes by name: axis names and sizes, in order.
    pub meshes: BTreeMap<String, Vec<(String, usize)>>,
}

/// Reads the signature of `@main` from MLIR text.
pub fn parse_signature(text: &str) -> Result<Signature, MlirError> {
    let main = find_main(text).ok_or(MlirError::NoMain)?;
    let after = &text[main..];
    let close = matching(after, 0).ok_or(MlirError::Unbalanced)?;
    let params_text = &after[1..close];
    let mut parameters = Vec::new();
    for (i, p) in split_top_level(params_text).into_iter().enumerate() {
        let p = p.trim();
        if p.is_empty() {
            continue;
        }
        let (name, rest) = p
            .split_once(':')
            .ok_or_else(|| syntax("parameter", p, "expected `%name: type`"))?;
        let (ty, sharding) = parse_typed_value(rest.trim())?;
        let name = name.trim();
        parameters.push(Value {
            name: if name.is_empty() {
                format!("%arg{i}")
            } else {
                name.to_owned()
            },
            ty,
            sharding,
            donated: is_donated(rest),
        });
    }
    let rest = after[close + 1..].trim_start();
    let results_text = rest
        .strip_prefix("->")
        .map(str::trim_start)
        .ok_or_else(|| {
            syntax(
                "signature of @main",
                rest,
                "expected `->` after the parameters",
            )
        })?;
    let results_list: Vec<&str> = if results_text.starts_with('(') {
        let close = matching(results_text, 0).ok_or(MlirError::Unbalanced)?;
        split_top_level(&results_text[1..close])
    } else {
        // A single result type, up to the body's `{` at top level.
        let end = top_level_find(results_text, '{').unwrap_or(results_text.len());
        vec![&results_text[..end]]
    };
    let mut results = Vec::new();
    for (i, r) in results_list.into_iter().enumerate() {
        let r = r.trim();
        if r.is_empty() {
            continue;
        }
        let (ty, sharding) = parse_typed_value(r)?;
        results.push(Value {
            name: format!("result {i}"),
            ty,
            sharding,
            donated: false,
        });
    }
    let module_head = &text[..main];
    Ok(Signature {
        parameters,
        results,
        num_replicas: int_attr(module_head, "mhlo.num_replicas"),
        num_partitions: int_attr(module_head, "mhlo.num_partitions"),
        meshes: parse_meshes(module_head)?,
    })
}

/// Byte offset of the `(` that opens @main's parameters.
fn find_main(text: &str) -> Option<usize> {
    let mut from = 0;
    while let Some(pos) = text.get(from..)?.find("func.func") {
        let start = from + pos;
        let line_end = text[start..].find('(').map(|p| start + p)?;
        let head = &text[start..line_end];
        if head.split_whitespace().last() == Some("@main") {
            return Some(line_end);
        }
        from = start + "func.func".len();
    }
    None
}

/// Index of the bracket closing the one at `open` (which must be `(`, `<`,
/// `[` or `{`), skipping string literals.
fn matching(s: &str, open: usize) -> Option<usize> {
    let bytes = s.as_bytes();
    let mut stack = Vec::new();
    let mut i = open;
    while i < bytes.len() {
        match bytes[i] {
            b'"' => i = skip_string(bytes, i)?,
            c @ (b'(' | b'[' | b'{' | b'<') => stack.push(c),
            b'-' if bytes.get(i + 1) == Some(&b'>') => i += 1,
            c @ (b')' | b']' | b'}' | b'>') => {
                let want = match c {
                    b')' => b'(',
                    b']' => b'[',
                    b'}' => b'{',
                    _ => b'<',
                };
                if stack.pop()? != want {
                    return None;
                }
                if stack.is_empty() {
                    return Some(i);
                }
            }
            _ => {}
        }
        i += 1;
    }
    None
}

/// Index of the closing quote of the string starting at `i`.
fn skip_string(bytes: &[u8], i: usize) -> Option<usize> {
    let mut j = i + 1;
    while j < bytes.len() {
        match bytes[j] {
            b'\\' => j += 2,
            b'"' => return Some(j),
            _ => j += 1,
        }
    }
    None
}

/// Splits at commas outside brackets and strings.
fn split_top_level(s: &str) -> Vec<&str> {
    let bytes = s.as_bytes();
    let mut parts = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'"' => match skip_string(bytes, i) {
                Some(j) => i = j,
                None => break,
            },
            b'(' | b'[' | b'{' | b'<' => depth += 1,
            b'-' if bytes.get(i + 1) == Some(&b'>') => i += 1,
            b')' | b']' | b'}' | b'>' => depth -= 1,
            b',' if depth == 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
        i += 1;
    }
    parts.push(&s[start..]);
    parts
}

/// First occurrence of `c` outside brackets (other than `c` itself opening).
fn top_level_find(s: &str, c: char) -> Option<usize> {
    let mut depth = 0i32;
    for (i, ch) in s.char_indices() {
        if ch == c && depth == 0 {
            return Some(i);
        }
        match ch {
            '(' | '[' | '{' | '<' => depth += 1,
            ')' | ']' | '}' | '>' => depth -= 1,
            _ => {}
        }
    }
    None
}

/// Whether a parameter's attributes donate its buffer.
fn is_donated(param: &str) -> bool {
    let attrs = top_level_find(param.trim(), '{').map_or("", |i| &param.trim()[i..]);
    attrs.contains("tf.aliasing_output") || attrs.contains("jax.buffer_donor = true")
}

/// `tensor<...> {attrs}` → type and sharding.
fn parse_typed_value(s: &str) -> Result<(TensorType, Option<ShardingAnnotation>), MlirError> {
    let s = s.trim();
    let (ty_text, attrs) = match top_level_find(s, '{') {
        Some(i) => (&s[..i], Some(&s[i..])),
        None => (s, None),
    };
    let ty = parse_tensor_type(ty_text.trim())?;
    let sharding = match attrs {
        Some(a) => parse_sharding_attr(a)?,
        None => None,
    };
    Ok((ty, sharding))
}

/// `tensor<2x3xf32>` or `tensor<f32>`.
pub fn parse_tensor_type(s: &str) -> Result<TensorType, MlirError> {
    let inner = s
        .strip_prefix("tensor<")
        .and_then(|r| r.strip_suffix('>'))
        .ok_or_else(|| syntax("type", s, "only ranked tensor types are supported"))?;
    if inner.contains(',') {
        return Err(syntax("type", s, "tensor encodings are not supported"));
    }
    let mut parts: Vec<&str> = inner.split('x').collect();
    let elem = parts.pop().unwrap_or_default().trim();
    let element_type = ElementType::parse(elem)
        .ok_or_else(|| syntax("type", s, format!("unsupported element type `{elem}`")))?;
    let dims = parts
        .into_iter()
        .map(|d| match d.trim() {
            "?" => Err(syntax("type", s, "dynamic dimensions are not supported")),
            d => d
                .parse::<i64>()
                .ok()
                .filter(|&v| v >= 0)
                .ok_or_else(|| syntax("type", s, format!("bad dimension `{d}`"))),
        })
        .collect::<Result<Vec<_>, _>>()?;
    // Bounded before any product is formed: `byte_len` and every buffer
    // size after it then fit.
    if checked_size(element_type, &dims, MAX_JOB_ARRAY_BYTES).is_err() {
        return Err(syntax("type", s, "more than 1 TiB"));
    }
    Ok(TensorType { element_type, dims })
}

/// The sharding inside an attribute dictionary, if any.
fn parse_sharding_attr(dict: &str) -> Result<Option<ShardingAnnotation>, MlirError> {
    if let Some(pos) = dict.find("mhlo.sharding") {
        let rest = dict[pos + "mhlo.sharding".len()..].trim_start();
        let rest = rest
            .strip_prefix('=')
            .map(str::trim_start)
            .ok_or_else(|| syntax("attribute", dict, "expected `mhlo.sharding = \"...\"`"))?;
        if !rest.starts_with('"') {
            return Err(syntax("attribute", dict, "mhlo.sharding must be a string"));
        }
        let end = skip_string(rest.as_bytes(), 0).ok_or(MlirError::Unbalanced)?;
        return Ok(Some(ShardingAnnotation::Gspmd(rest[1..end].to_owned())));
    }
    if let Some(pos) = dict.find("#sdy.sharding<") {
        let open = pos + "#sdy.sharding".len();
        let close = matching(dict, open).ok_or(MlirError::Unbalanced)?;
        let inner = &dict[open + 1..close];
        let parts = split_top_level(inner);
        let mesh = parts
            .first()
            .map(|m| m.trim())
            .and_then(|m| m.strip_prefix('@'))
            .ok_or_else(|| {
                syntax(
                    "sdy.sharding",
                    inner,
                    "only named meshes (`@mesh`) are supported",
                )
            })?
            .to_owned();
        let dims_text = parts
            .get(1)
            .map(|d| d.trim())
            .ok_or_else(|| syntax("sdy.sharding", inner, "missing dimension shardings"))?;
        let list = dims_text
            .strip_prefix('[')
            .and_then(|d| d.strip_suffix(']'))
            .ok_or_else(|| syntax("sdy.sharding", inner, "expected `[{...}, ...]`"))?;
        let mut dims = Vec::new();
        for d in split_top_level(list) {
            let d = d.trim();
            if d.is_empty() {
                continue;
            }
            let axes = d
                .strip_prefix('{')
                .and_then(|x| x.strip_suffix('}'))
                .ok_or_else(|| syntax("sdy.sharding", d, "expected `{\"axis\", ...}`"))?;
            let mut names = Vec::new();
            for a in split_top_level(axes) {
                let a = a.trim();
                if a.is_empty() || a == "?" {
                    continue;
                }
                let name = a
                    .strip_prefix('"')
                    .and_then(|x| x.strip_suffix('"'))
                    .ok_or_else(|| {
                        syntax(
                            "sdy.sharding",
                            a,
                            "sub-axes and open dimensions are not supported",
                        )
                    })?;
                names.push(name.to_owned());
            }
            dims.push(names);
        }
        return Ok(Some(ShardingAnnotation::Shardy { mesh, dims }));
    }
    Ok(None)
}

/// `name = N : i32` anywhere in `s`.
fn int_attr(s: &str, name: &str) -> Option<usize> {
    let pos = s.find(name)?;
    let rest = s[pos + name.len()..]
        .trim_start()
        .strip_prefix('=')?
        .trim_start();
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// `sdy.mesh @name = <["x"=4, "y"=2]>` declarations.
fn parse_meshes(s: &str) -> Result<BTreeMap<String, Vec<(String, usize)>>, MlirError> {
    let mut meshes = BTreeMap::new();
    let mut from = 0;
    while let Some(pos) = s[from..].find("sdy.mesh @") {
        let start = from + pos + "sdy.mesh @".len();
        let rest = &s[start..];
        let name: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == '.' || *c == '$')
            .collect();
        let after = &rest[name.len()..];
        let open = after
            .find('<')
            .ok_or_else(|| syntax("sdy.mesh", rest, "expected `= <[...]>`"))?;
        let close = matching(after, open).ok_or(MlirError::Unbalanced)?;
        let inner = after[open + 1..close].trim();
        let list = inner
            .strip_prefix('[')
            .and_then(|l| l.split(']').next())
            .ok_or_else(|| syntax("sdy.mesh", inner, "expected `[\"axis\"=size, ...]`"))?;
        let mut axes = Vec::new();
        for a in split_top_level(list) {
            let a = a.trim();
            if a.is_empty() {
                continue;
            }
            let (n, size) = a
                .split_once('=')
                .ok_or_else(|| syntax("sdy.mesh", a, "expected `\"axis\"=size`"))?;
            let n = n.trim().trim_matches('"').to_owned();
            let size = size
                .trim()
                .parse()
                .map_err(|_| syntax("sdy.mesh", a, "bad axis size"))?;
            axes.push((n, size));
        }
        meshes.insert(name.clone(), axes);
        from = start + name.len() + close;
    }
    Ok(meshes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jax_output_with_result_attributes() {
        let text = r#"module @jit_f attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<2x2xf32>, %arg1: tensor<i32>) -> (tensor<2x2xf32> {jax.result_info = "result[0]"}, tensor<ui8> {jax.result_info = "result[1]"}) {
    return %arg0 : tensor<2x2xf32>
  }
}"#;
        let s = parse_signature(text).unwrap();
        assert_eq!(s.parameters.len(), 2);
        assert_eq!(s.parameters[0].name, "%arg0");
        assert_eq!(s.parameters[0].ty.to_string(), "f32[2, 2]");
        assert_eq!(s.parameters[1].ty.dims, Vec::<i64>::new());
        assert_eq!(s.results.len(), 2);
        assert_eq!(s.results[1].ty.element_type, ElementType::U8);
        assert_eq!((s.num_replicas, s.num_partitions), (Some(1), Some(1)));
    }

    #[test]
    fn bare_function_with_a_single_result() {
        let s = parse_signature("func.func @main(%a: tensor<3xbf16>) -> tensor<3xbf16> {\n return %a : tensor<3xbf16>\n}")
            .unwrap();
        assert_eq!(s.parameters[0].ty.element_type, ElementType::BF16);
        assert_eq!(s.results.len(), 1);
        assert_eq!(s.num_partitions, None);
    }

    #[test]
    fn other_functions_are_skipped() {
        let text = "func.func private @helper(%x: tensor<f64>) -> tensor<f64> { return %x : tensor<f64> }\nfunc.func public @main(%y: tensor<2xi1>) -> tensor<2xi1> { return %y : tensor<2xi1> }";
        let s = parse_signature(text).unwrap();
        assert_eq!(s.parameters[0].ty.element_type, ElementType::Pred);
    }

    #[test]
    fn gspmd_and_shardy_annotations() {
        let g = parse_signature(
            r#"func.func public @main(%arg0: tensor<8xf32> {mhlo.sharding = "{devices=[4]<=[4]}"}) -> (tensor<f32> {mhlo.sharding = "{replicated}"}) { }"#,
        )
        .unwrap();
        assert_eq!(
            g.parameters[0].sharding,
            Some(ShardingAnnotation::Gspmd("{devices=[4]<=[4]}".into()))
        );
        assert_eq!(
            g.results[0].sharding,
            Some(ShardingAnnotation::Gspmd("{replicated}".into()))
        );
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../pjrt/tests/programs/spmd_sum_sdy.mlir"
        ))
        .unwrap();
        let s = parse_signature(&text).unwrap();
        assert_eq!(s.meshes["mesh"], vec![("x".to_owned(), 4)]);
        assert_eq!(
            s.parameters[0].sharding,
            Some(ShardingAnnotation::Shardy {
                mesh: "mesh".into(),
                dims: vec![vec!["x".into()]]
            })
        );
        assert_eq!(
            s.results[0].sharding,
            Some(ShardingAnnotation::Shardy {
                mesh: "mesh".into(),
                dims: vec![]
            })
        );
        assert_eq!(s.num_partitions, Some(4));
    }

    #[test]
    fn malformed_programs_are_errors() {
        assert_eq!(parse_signature("module {}"), Err(MlirError::NoMain));
        assert_eq!(
            parse_signature("func.func @main(%a: tensor<2xf32>"),
            Err(MlirError::Unbalanced)
        );
        for bad in [
            "func.func @main(%a: tensor<?xf32>) -> tensor<f32> {}",
            "func.func @main(%a: tensor<2xc64>) -> tensor<f32> {}",
            "func.func @main(%a: memref<2xf32>) -> tensor<f32> {}",
            "func.func @main(%a) -> tensor<f32> {}",
            "func.func @main(%a: tensor<2xf32>) tensor<f32> {}",
        ] {
            assert!(
                matches!(parse_signature(bad), Err(MlirError::Syntax { .. })),
                "{bad}"
            );
        }
    }
}
