//! Programs and compile options.
//!
//! `PJRT_Client_Compile` takes an `xla.CompileOptionsProto` as bytes. We
//! declare the few fields we set with prost's derive (no protoc, no .proto
//! files at build time); field numbers follow
//! `xla/pjrt/proto/compile_options.proto` and `xla/xla_data.proto`.
//! An empty options message makes the CPU plugin abort the process, so
//! replicas and partitions are always sent.

use crate::error::{Error, Result};

/// The encoding of a [`Program`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProgramFormat {
    /// StableHLO (or MHLO) as MLIR text or MLIR bytecode: format `mlir`.
    Mlir,
    /// A serialized `xla.HloModuleProto`: format `hlo`.
    HloProto,
}

impl ProgramFormat {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            ProgramFormat::Mlir => "mlir",
            ProgramFormat::HloProto => "hlo",
        }
    }
}

/// A program to compile.
#[derive(Debug, Clone)]
pub struct Program {
    format: ProgramFormat,
    code: Vec<u8>,
}

impl Program {
    /// StableHLO as MLIR text.
    pub fn mlir_text(text: impl Into<String>) -> Program {
        Program {
            format: ProgramFormat::Mlir,
            code: text.into().into_bytes(),
        }
    }

    /// StableHLO as MLIR bytecode (e.g. a portable artifact from
    /// `jax.export` or `stablehlo-translate --serialize`).
    pub fn mlir_bytecode(bytes: Vec<u8>) -> Program {
        Program {
            format: ProgramFormat::Mlir,
            code: bytes,
        }
    }

    /// A serialized `HloModuleProto`.
    pub fn hlo_proto(bytes: Vec<u8>) -> Program {
        Program {
            format: ProgramFormat::HloProto,
            code: bytes,
        }
    }

    /// Whether the code is MLIR bytecode.
    pub fn is_mlir_bytecode(&self) -> bool {
        self.format == ProgramFormat::Mlir && self.code.starts_with(b"ML\xefR")
    }

    /// Text or bytecode.
    pub fn format(&self) -> ProgramFormat {
        self.format
    }

    /// The program's bytes.
    pub fn code(&self) -> &[u8] {
        &self.code
    }
}

/// How to compile: replicas, partitions, SPMD partitioning and an optional
/// fixed device assignment.
#[derive(Debug, Clone, PartialEq)]
pub struct CompileOptions {
    /// Replicas of the program.
    pub num_replicas: usize,
    /// SPMD partitions.
    pub num_partitions: usize,
    /// Partition the program along its sharding annotations (SPMD).
    pub use_spmd_partitioning: bool,
    /// Use the Shardy partitioner (programs with `sdy` sharding attributes).
    pub use_shardy_partitioner: bool,
    /// `device_assignment[replica][partition]` = global device id.
    pub device_assignment: Option<Vec<Vec<i64>>>,
    /// XLA debug options for this compilation (`env_option_overrides`),
    /// by name: what `XLA_FLAGS` would set, for one program only.
    pub overrides: Vec<(String, OptionOverride)>,
}

/// The value of one XLA debug option override.
#[derive(Debug, Clone, PartialEq)]
pub enum OptionOverride {
    /// A string option.
    Str(String),
    /// A boolean option.
    Bool(bool),
    /// An integer option.
    Int(i64),
}

impl CompileOptions {
    /// `num_replicas` × `num_partitions`; SPMD partitioning is on when
    /// there is more than one partition.
    pub fn new(num_replicas: usize, num_partitions: usize) -> CompileOptions {
        CompileOptions {
            num_replicas,
            num_partitions,
            use_spmd_partitioning: num_partitions > 1,
            use_shardy_partitioner: false,
            device_assignment: None,
            overrides: Vec::new(),
        }
    }

    /// Sets an XLA debug option for this compilation.
    pub fn with_override(
        mut self,
        name: impl Into<String>,
        value: OptionOverride,
    ) -> CompileOptions {
        let name = name.into();
        self.overrides.retain(|(n, _)| *n != name);
        self.overrides.push((name, value));
        self
    }

    /// Sets a fixed device assignment, `[replica][partition]`.
    pub fn with_device_assignment(mut self, assignment: Vec<Vec<i64>>) -> CompileOptions {
        self.device_assignment = Some(assignment);
        self
    }

    /// Checks the options before any of it reaches the plugin.
    pub fn validate(&self) -> Result<()> {
        if self.num_replicas == 0 || self.num_partitions == 0 {
            return Err(Error::InvalidArgument(format!(
                "compile options need at least 1 replica and 1 partition, got {} and {}",
                self.num_replicas, self.num_partitions
            )));
        }
        if let Some(da) = &self.device_assignment {
            if da.len() != self.num_replicas || da.iter().any(|r| r.len() != self.num_partitions) {
                return Err(Error::InvalidArgument(format!(
                    "device assignment must be {} replicas × {} partitions",
                    self.num_replicas, self.num_partitions
                )));
            }
            let mut ids: Vec<i64> = da.iter().flatten().copied().collect();
            ids.sort_unstable();
            if ids.windows(2).any(|w| w[0] == w[1]) {
                return Err(Error::InvalidArgument(
                    "device assignment repeats a device".into(),
                ));
            }
        }
        Ok(())
    }

    /// The serialized `xla.CompileOptionsProto`.
    pub fn encode(&self) -> Vec<u8> {
        use prost::Message;
        let device_assignment =
            self.device_assignment
                .as_ref()
                .map(|da| proto::DeviceAssignmentProto {
                    replica_count: self.num_replicas as i32,
                    computation_count: self.num_partitions as i32,
                    computation_devices: (0..self.num_partitions)
                        .map(|p| proto::ComputationDevice {
                            replica_device_ids: da.iter().map(|r| r[p]).collect(),
                        })
                        .collect(),
                });
        proto::CompileOptionsProto {
            executable_build_options: Some(proto::ExecutableBuildOptionsProto {
                device_ordinal: -1,
                num_replicas: self.num_replicas as i64,
                num_partitions: self.num_partitions as i64,
                use_spmd_partitioning: self.use_spmd_partitioning,
                device_assignment,
                use_shardy_partitioner: self.use_shardy_partitioner,
            }),
            env_option_overrides: self
                .overrides
                .iter()
                .map(|(k, v)| {
                    (
                        k.clone(),
                        proto::OptionOverrideProto {
                            value: Some(match v {
                                OptionOverride::Str(s) => {
                                    proto::override_value::Value::String(s.clone())
                                }
                                OptionOverride::Bool(b) => proto::override_value::Value::Bool(*b),
                                OptionOverride::Int(i) => proto::override_value::Value::Int(*i),
                            }),
                        },
                    )
                })
                .collect(),
        }
        .encode_to_vec()
    }
}

/// The subset of XLA's protos that we send.
mod proto {
    #[derive(Clone, PartialEq, prost::Message)]
    pub(super) struct CompileOptionsProto {
        #[prost(message, optional, tag = "3")]
        pub executable_build_options: Option<ExecutableBuildOptionsProto>,
        #[prost(btree_map = "string, message", tag = "7")]
        pub env_option_overrides: std::collections::BTreeMap<String, OptionOverrideProto>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub(super) struct OptionOverrideProto {
        #[prost(oneof = "override_value::Value", tags = "1, 2, 3")]
        pub value: Option<override_value::Value>,
    }

    pub(super) mod override_value {
        #[derive(Clone, PartialEq, prost::Oneof)]
        pub(crate) enum Value {
            #[prost(string, tag = "1")]
            String(String),
            #[prost(bool, tag = "2")]
            Bool(bool),
            #[prost(int64, tag = "3")]
            Int(i64),
        }
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub(super) struct ExecutableBuildOptionsProto {
        #[prost(int64, tag = "1")]
        pub device_ordinal: i64,
        #[prost(int64, tag = "4")]
        pub num_replicas: i64,
        #[prost(int64, tag = "5")]
        pub num_partitions: i64,
        #[prost(bool, tag = "6")]
        pub use_spmd_partitioning: bool,
        #[prost(message, optional, tag = "9")]
        pub device_assignment: Option<DeviceAssignmentProto>,
        #[prost(bool, tag = "19")]
        pub use_shardy_partitioner: bool,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub(super) struct DeviceAssignmentProto {
        #[prost(int32, tag = "1")]
        pub replica_count: i32,
        #[prost(int32, tag = "2")]
        pub computation_count: i32,
        #[prost(message, repeated, tag = "3")]
        pub computation_devices: Vec<ComputationDevice>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub(super) struct ComputationDevice {
        #[prost(int64, repeated, tag = "1")]
        pub replica_device_ids: Vec<i64>,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    #[test]
    fn encoding_always_carries_replicas_and_partitions() {
        let bytes = CompileOptions::new(1, 1).encode();
        let decoded = proto::CompileOptionsProto::decode(bytes.as_slice()).unwrap();
        let ebo = decoded.executable_build_options.unwrap();
        assert_eq!((ebo.num_replicas, ebo.num_partitions), (1, 1));
        assert_eq!(ebo.device_ordinal, -1);
        assert!(!ebo.use_spmd_partitioning);
    }

    #[test]
    fn device_assignment_is_stored_by_partition() {
        let opts =
            CompileOptions::new(2, 3).with_device_assignment(vec![vec![0, 1, 2], vec![3, 4, 5]]);
        opts.validate().unwrap();
        let decoded = proto::CompileOptionsProto::decode(opts.encode().as_slice()).unwrap();
        let da = decoded
            .executable_build_options
            .unwrap()
            .device_assignment
            .unwrap();
        assert_eq!((da.replica_count, da.computation_count), (2, 3));
        let by_partition: Vec<Vec<i64>> = da
            .computation_devices
            .into_iter()
            .map(|c| c.replica_device_ids)
            .collect();
        assert_eq!(by_partition, vec![vec![0, 3], vec![1, 4], vec![2, 5]]);
    }

    #[test]
    fn overrides_travel_as_env_option_overrides_and_the_last_one_wins() {
        let opts = CompileOptions::new(1, 2)
            .with_override("xla_gpu_shard_autotuning", OptionOverride::Bool(true))
            .with_override("xla_gpu_shard_autotuning", OptionOverride::Bool(false))
            .with_override("xla_dump_to", OptionOverride::Str("/tmp/d".into()));
        let decoded = proto::CompileOptionsProto::decode(opts.encode().as_slice()).unwrap();
        let o = decoded.env_option_overrides;
        assert_eq!(o.len(), 2);
        assert_eq!(
            o["xla_gpu_shard_autotuning"].value,
            Some(proto::override_value::Value::Bool(false))
        );
        assert_eq!(
            o["xla_dump_to"].value,
            Some(proto::override_value::Value::String("/tmp/d".into()))
        );
    }

    #[test]
    fn invalid_options_are_refused() {
        assert!(CompileOptions::new(0, 1).validate().is_err());
        assert!(CompileOptions::new(1, 2)
            .with_device_assignment(vec![vec![0]])
            .validate()
            .is_err());
        assert!(CompileOptions::new(1, 2)
            .with_device_assignment(vec![vec![1, 1]])
            .validate()
            .is_err());
    }
}
