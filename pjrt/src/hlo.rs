//! The parameter shapes of a compiled program, read from the optimized
//! `xla.HloModuleProto` the plugin returns (`PJRT_Executable_OptimizedProgram`).
//!
//! The C API has no call for parameter shapes, and the CPU plugin does not
//! check arguments against them: a buffer of the wrong shape would be read
//! out of bounds. Execution therefore checks every argument against these
//! shapes. Field numbers follow `xla/service/hlo.proto` and
//! `xla/xla_data.proto`; only the fields needed are declared.

use prost::Message;

use crate::buffer::ElementType;

/// Shape of one parameter of the entry computation (per partition, after
/// SPMD partitioning).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParameterShape {
    /// `None` for types tessel does not handle (complex, fp8, tokens...).
    pub element_type: Option<ElementType>,
    /// The dimensions.
    pub dims: Vec<i64>,
}

impl std::fmt::Display for ParameterShape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.element_type {
            Some(t) => write!(f, "{t}{:?}", self.dims),
            None => write!(f, "?{:?}", self.dims),
        }
    }
}

/// XLA `PrimitiveType` values.
fn element_type(primitive: i32) -> Option<ElementType> {
    use ElementType::*;
    Some(match primitive {
        1 => Pred,
        2 => S8,
        3 => S16,
        4 => S32,
        5 => S64,
        6 => U8,
        7 => U16,
        8 => U32,
        9 => U64,
        10 => F16,
        11 => F32,
        12 => F64,
        16 => BF16,
        _ => return None,
    })
}

const TUPLE: i32 = 13;

/// Parameter shapes of the entry computation, or `None` if the module cannot
/// be decoded or takes tuple parameters.
pub fn entry_parameter_shapes(module: &[u8]) -> Option<Vec<ParameterShape>> {
    let m = HloModuleProto::decode(module).ok()?;
    let entry = m
        .computations
        .iter()
        .find(|c| m.entry_computation_id != 0 && c.id == m.entry_computation_id)
        .or_else(|| {
            m.computations
                .iter()
                .find(|c| c.name == m.entry_computation_name)
        })?;
    let params = &entry.program_shape.as_ref()?.parameters;
    if params.iter().any(|p| p.element_type == TUPLE) {
        return None;
    }
    Some(
        params
            .iter()
            .map(|p| ParameterShape {
                element_type: element_type(p.element_type),
                dims: p.dimensions.clone(),
            })
            .collect(),
    )
}

/// The `HloModuleProto` inside an `HloModuleProtoWithConfig` (field 1).
pub fn module_of_module_with_config(bytes: &[u8]) -> Option<Vec<u8>> {
    HloModuleProtoWithConfig::decode(bytes)
        .ok()
        .map(|m| m.hlo_module)
}

#[derive(Clone, PartialEq, Message)]
struct HloModuleProtoWithConfig {
    /// Kept as bytes: decoded separately by `entry_parameter_shapes`.
    #[prost(bytes = "vec", tag = "1")]
    hlo_module: Vec<u8>,
}

#[derive(Clone, PartialEq, Message)]
struct HloModuleProto {
    #[prost(string, tag = "2")]
    entry_computation_name: String,
    #[prost(message, repeated, tag = "3")]
    computations: Vec<HloComputationProto>,
    #[prost(int64, tag = "6")]
    entry_computation_id: i64,
}

#[derive(Clone, PartialEq, Message)]
struct HloComputationProto {
    #[prost(string, tag = "1")]
    name: String,
    #[prost(message, optional, tag = "4")]
    program_shape: Option<ProgramShapeProto>,
    #[prost(int64, tag = "5")]
    id: i64,
}

#[derive(Clone, PartialEq, Message)]
struct ProgramShapeProto {
    #[prost(message, repeated, tag = "1")]
    parameters: Vec<ShapeProto>,
}

#[derive(Clone, PartialEq, Message)]
struct ShapeProto {
    #[prost(int32, tag = "2")]
    element_type: i32,
    #[prost(int64, repeated, tag = "3")]
    dimensions: Vec<i64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn garbage_decodes_to_none() {
        assert_eq!(entry_parameter_shapes(b"\xff\xff\xff"), None);
        assert_eq!(entry_parameter_shapes(b""), None);
    }

    #[test]
    fn entry_is_found_by_id_then_name() {
        let shape = |t, d: Vec<i64>| ShapeProto {
            element_type: t,
            dimensions: d,
        };
        let comp = |name: &str, id, params| HloComputationProto {
            name: name.into(),
            id,
            program_shape: Some(ProgramShapeProto { parameters: params }),
        };
        let m = HloModuleProto {
            entry_computation_name: "main".into(),
            entry_computation_id: 7,
            computations: vec![
                comp("helper", 3, vec![shape(4, vec![])]),
                comp("main", 7, vec![shape(11, vec![2, 2])]),
            ],
        };
        let got = entry_parameter_shapes(&m.encode_to_vec()).unwrap();
        assert_eq!(
            got,
            vec![ParameterShape {
                element_type: Some(ElementType::F32),
                dims: vec![2, 2]
            }]
        );
        let tupled = HloModuleProto {
            computations: vec![comp("main", 7, vec![shape(TUPLE, vec![])])],
            ..m
        };
        assert_eq!(entry_parameter_shapes(&tupled.encode_to_vec()), None);
    }
}
