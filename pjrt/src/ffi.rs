//! Raw declarations of the PJRT C API (`xla/pjrt/c/pjrt_c_api.h`).
//!
//! Everything here mirrors the C header field for field; nothing here is
//! safe to use directly. The declarations follow API version
//! [`PJRT_API_MAJOR`].[`PJRT_API_MINOR`]; the structs we send carry the
//! `struct_size` of that version, which newer plugins accept (PJRT only ever
//! appends fields).
//!
//! Only the structs this crate uses are declared. Each one's layout is
//! recorded in [`LAYOUTS`], which `tests/abi.rs` compares field by field
//! against the header shipped in the installed plugin wheel, compiled by the
//! system C compiler.

// Declarations of the C API, field for field as `pjrt_c_api.h` names
// them (checked by tests/abi.rs): the header is their documentation.
#![allow(missing_docs)]
#![allow(
    non_camel_case_types,
    non_snake_case,
    non_upper_case_globals,
    dead_code
)]

use std::ffi::{c_char, c_int, c_void};

/// Major version of the declarations below.
pub const PJRT_API_MAJOR: i32 = 0;
/// Minor version of the declarations below: the header of `xla-cpu-pjrt`.
pub const PJRT_API_MINOR: i32 = 81;

/// Opaque handles.
macro_rules! opaque {
    ($($name:ident),* $(,)?) => {$(
        #[repr(C)]
        pub struct $name {
            _private: [u8; 0],
            _pin: core::marker::PhantomData<(*mut u8, core::marker::PhantomPinned)>,
        }
    )*};
}
opaque!(
    PJRT_Error,
    PJRT_Event,
    PJRT_Client,
    PJRT_Device,
    PJRT_Memory,
    PJRT_DeviceDescription,
    PJRT_TopologyDescription,
    PJRT_Executable,
    PJRT_LoadedExecutable,
    PJRT_Buffer,
    PJRT_ExecuteContext,
);

pub type PJRT_Error_Code = c_int;
pub const PJRT_Error_Code_OK: PJRT_Error_Code = 0;
pub const PJRT_Error_Code_CANCELLED: PJRT_Error_Code = 1;
pub const PJRT_Error_Code_UNKNOWN: PJRT_Error_Code = 2;
pub const PJRT_Error_Code_INVALID_ARGUMENT: PJRT_Error_Code = 3;
pub const PJRT_Error_Code_DEADLINE_EXCEEDED: PJRT_Error_Code = 4;
pub const PJRT_Error_Code_NOT_FOUND: PJRT_Error_Code = 5;
pub const PJRT_Error_Code_ALREADY_EXISTS: PJRT_Error_Code = 6;
pub const PJRT_Error_Code_PERMISSION_DENIED: PJRT_Error_Code = 7;
pub const PJRT_Error_Code_RESOURCE_EXHAUSTED: PJRT_Error_Code = 8;
pub const PJRT_Error_Code_FAILED_PRECONDITION: PJRT_Error_Code = 9;
pub const PJRT_Error_Code_ABORTED: PJRT_Error_Code = 10;
pub const PJRT_Error_Code_OUT_OF_RANGE: PJRT_Error_Code = 11;
pub const PJRT_Error_Code_UNIMPLEMENTED: PJRT_Error_Code = 12;
pub const PJRT_Error_Code_INTERNAL: PJRT_Error_Code = 13;
pub const PJRT_Error_Code_UNAVAILABLE: PJRT_Error_Code = 14;
pub const PJRT_Error_Code_DATA_LOSS: PJRT_Error_Code = 15;
pub const PJRT_Error_Code_UNAUTHENTICATED: PJRT_Error_Code = 16;

pub type PJRT_NamedValue_Type = c_int;
pub const PJRT_NamedValue_kString: PJRT_NamedValue_Type = 0;
pub const PJRT_NamedValue_kInt64: PJRT_NamedValue_Type = 1;
pub const PJRT_NamedValue_kInt64List: PJRT_NamedValue_Type = 2;
pub const PJRT_NamedValue_kFloat: PJRT_NamedValue_Type = 3;
pub const PJRT_NamedValue_kBool: PJRT_NamedValue_Type = 4;

pub type PJRT_Buffer_Type = c_int;
pub const PJRT_Buffer_Type_INVALID: PJRT_Buffer_Type = 0;
pub const PJRT_Buffer_Type_PRED: PJRT_Buffer_Type = 1;
pub const PJRT_Buffer_Type_S8: PJRT_Buffer_Type = 2;
pub const PJRT_Buffer_Type_S16: PJRT_Buffer_Type = 3;
pub const PJRT_Buffer_Type_S32: PJRT_Buffer_Type = 4;
pub const PJRT_Buffer_Type_S64: PJRT_Buffer_Type = 5;
pub const PJRT_Buffer_Type_U8: PJRT_Buffer_Type = 6;
pub const PJRT_Buffer_Type_U16: PJRT_Buffer_Type = 7;
pub const PJRT_Buffer_Type_U32: PJRT_Buffer_Type = 8;
pub const PJRT_Buffer_Type_U64: PJRT_Buffer_Type = 9;
pub const PJRT_Buffer_Type_F16: PJRT_Buffer_Type = 10;
pub const PJRT_Buffer_Type_F32: PJRT_Buffer_Type = 11;
pub const PJRT_Buffer_Type_F64: PJRT_Buffer_Type = 12;
pub const PJRT_Buffer_Type_BF16: PJRT_Buffer_Type = 13;
pub const PJRT_Buffer_Type_C64: PJRT_Buffer_Type = 14;
pub const PJRT_Buffer_Type_C128: PJRT_Buffer_Type = 15;

pub type PJRT_HostBufferSemantics = c_int;
pub const PJRT_HostBufferSemantics_kImmutableOnlyDuringCall: PJRT_HostBufferSemantics = 0;
pub const PJRT_HostBufferSemantics_kImmutableUntilTransferCompletes: PJRT_HostBufferSemantics = 1;

pub type PJRT_CallbackError = Option<
    unsafe extern "C" fn(
        code: PJRT_Error_Code,
        message: *const c_char,
        size: usize,
    ) -> *mut PJRT_Error,
>;
pub type PJRT_Event_OnReadyCallback =
    Option<unsafe extern "C" fn(error: *mut PJRT_Error, user_arg: *mut c_void)>;
pub type PJRT_KeyValueGetCallback_ValueDeleter = Option<unsafe extern "C" fn(value: *mut c_char)>;
pub type PJRT_KeyValueGetCallback =
    Option<unsafe extern "C" fn(args: *mut PJRT_KeyValueGetCallback_Args) -> *mut PJRT_Error>;
pub type PJRT_KeyValueTryGetCallback =
    Option<unsafe extern "C" fn(args: *mut PJRT_KeyValueTryGetCallback_Args) -> *mut PJRT_Error>;
pub type PJRT_KeyValuePutCallback =
    Option<unsafe extern "C" fn(args: *mut PJRT_KeyValuePutCallback_Args) -> *mut PJRT_Error>;

#[repr(C)]
#[derive(Clone, Copy)]
pub union PJRT_NamedValue_Value {
    pub string_value: *const c_char,
    pub int64_value: i64,
    pub int64_array_value: *const i64,
    pub float_value: f32,
    pub bool_value: bool,
}

/// Layout of one declared struct: its `struct_size` and each field's offset,
/// by the field's C name.
#[derive(Debug, Clone, Copy)]
pub struct StructLayout {
    pub name: &'static str,
    pub struct_size: usize,
    pub fields: &'static [(&'static str, usize)],
}

/// `PJRT_STRUCT_SIZE`: offset of the last field plus its size. Fields of a
/// `repr(C)` struct are laid out in order, so the maximum over all fields is
/// the last one's end.
const fn max_end(ends: &[usize]) -> usize {
    let mut i = 0;
    let mut m = 0;
    while i < ends.len() {
        if ends[i] > m {
            m = ends[i];
        }
        i += 1;
    }
    m
}

/// Declares `repr(C)` structs, their `STRUCT_SIZE`, a zeroed constructor
/// that fills `struct_size`, and the [`LAYOUTS`] table.
macro_rules! pjrt_structs {
    ($(
        struct $name:ident { $( $field:ident $(as $cname:ident)? : $ty:ty ),* $(,)? }
    )*) => {
        $(
            #[repr(C)]
            pub struct $name { $( pub $field: $ty ),* }

            impl $name {
                /// `PJRT_STRUCT_SIZE` of this struct in the declared API version.
                pub const STRUCT_SIZE: usize = max_end(&[
                    $( core::mem::offset_of!($name, $field) + core::mem::size_of::<$ty>() ),*
                ]);

                /// All fields zero (null pointers, `None` callbacks, 0, false)
                /// and `struct_size` set.
                pub fn new() -> Self {
                    // SAFETY: every field type of a declared struct is a raw
                    // pointer, an `Option` of a function pointer, an integer,
                    // a float, a bool, a union of those, or `usize`; the
                    // all-zero bit pattern is a valid value for each.
                    let mut s: Self = unsafe { core::mem::zeroed() };
                    pjrt_structs!(@size s $($field)*);
                    s
                }
            }

            impl Default for $name {
                fn default() -> Self { Self::new() }
            }
        )*

        /// The layouts of every struct declared here, for the ABI test.
        pub const LAYOUTS: &[StructLayout] = &[
            $( StructLayout {
                name: stringify!($name),
                struct_size: $name::STRUCT_SIZE,
                fields: &[ $( (pjrt_structs!(@cname $field $($cname)?), core::mem::offset_of!($name, $field)) ),* ],
            } ),*
        ];
    };
    (@cname $field:ident $cname:ident) => { stringify!($cname) };
    (@cname $field:ident) => { stringify!($field) };
    (@size $s:ident struct_size $($rest:ident)*) => { $s.struct_size = Self::STRUCT_SIZE; };
    (@size $s:ident $($rest:ident)*) => {};
}

type Ext = *mut c_void;

pjrt_structs! {
    struct PJRT_Api_Version { struct_size: usize, extension_start: Ext, major_version: c_int, minor_version: c_int }

    struct PJRT_Error_Destroy_Args { struct_size: usize, extension_start: Ext, error: *mut PJRT_Error }
    struct PJRT_Error_Message_Args {
        struct_size: usize, extension_start: Ext, error: *const PJRT_Error,
        message: *const c_char, message_size: usize,
    }
    struct PJRT_Error_GetCode_Args {
        struct_size: usize, extension_start: Ext, error: *const PJRT_Error, code: PJRT_Error_Code,
    }

    struct PJRT_NamedValue {
        struct_size: usize, extension_start: Ext, name: *const c_char, name_size: usize,
        type_ as type: PJRT_NamedValue_Type, value as int64_value: PJRT_NamedValue_Value, value_size: usize,
    }

    struct PJRT_Plugin_Initialize_Args { struct_size: usize, extension_start: Ext }
    struct PJRT_Plugin_Attributes_Args {
        struct_size: usize, extension_start: Ext, attributes: *const PJRT_NamedValue, num_attributes: usize,
    }

    struct PJRT_Event_Destroy_Args { struct_size: usize, extension_start: Ext, event: *mut PJRT_Event }
    struct PJRT_Event_IsReady_Args { struct_size: usize, extension_start: Ext, event: *mut PJRT_Event, is_ready: bool }
    struct PJRT_Event_Await_Args { struct_size: usize, extension_start: Ext, event: *mut PJRT_Event }
    struct PJRT_Event_OnReady_Args {
        struct_size: usize, extension_start: Ext, event: *mut PJRT_Event,
        callback: PJRT_Event_OnReadyCallback, user_arg: *mut c_void,
    }

    struct PJRT_KeyValueGetCallback_Args {
        struct_size: usize, extension_start: Ext, key: *const c_char, key_size: usize,
        timeout_in_ms: c_int, callback_error: *mut PJRT_CallbackError, user_arg: *mut c_void,
        value: *mut c_char, value_size: usize, value_deleter_callback: PJRT_KeyValueGetCallback_ValueDeleter,
    }
    struct PJRT_KeyValueTryGetCallback_Args {
        struct_size: usize, extension_start: Ext, key: *const c_char, key_size: usize,
        callback_error: *mut PJRT_CallbackError, user_arg: *mut c_void,
        value: *mut c_char, value_size: usize, value_deleter_callback: PJRT_KeyValueGetCallback_ValueDeleter,
    }
    struct PJRT_KeyValuePutCallback_Args {
        struct_size: usize, extension_start: Ext, key: *const c_char, key_size: usize,
        value: *const c_char, value_size: usize, callback_error: *mut PJRT_CallbackError, user_arg: *mut c_void,
    }

    struct PJRT_Client_Create_Args {
        struct_size: usize, extension_start: Ext, create_options: *const PJRT_NamedValue, num_options: usize,
        kv_get_callback: PJRT_KeyValueGetCallback, kv_get_user_arg: *mut c_void,
        kv_put_callback: PJRT_KeyValuePutCallback, kv_put_user_arg: *mut c_void,
        client: *mut PJRT_Client,
        kv_try_get_callback: PJRT_KeyValueTryGetCallback, kv_try_get_user_arg: *mut c_void,
    }
    struct PJRT_Client_Destroy_Args { struct_size: usize, extension_start: Ext, client: *mut PJRT_Client }
    struct PJRT_Client_PlatformName_Args {
        struct_size: usize, extension_start: Ext, client: *mut PJRT_Client,
        platform_name: *const c_char, platform_name_size: usize,
    }
    struct PJRT_Client_ProcessIndex_Args {
        struct_size: usize, extension_start: Ext, client: *mut PJRT_Client, process_index: c_int,
    }
    struct PJRT_Client_PlatformVersion_Args {
        struct_size: usize, extension_start: Ext, client: *mut PJRT_Client,
        platform_version: *const c_char, platform_version_size: usize,
    }
    struct PJRT_Client_Devices_Args {
        struct_size: usize, extension_start: Ext, client: *mut PJRT_Client,
        devices: *const *mut PJRT_Device, num_devices: usize,
    }
    struct PJRT_Client_AddressableDevices_Args {
        struct_size: usize, extension_start: Ext, client: *mut PJRT_Client,
        addressable_devices: *const *mut PJRT_Device, num_addressable_devices: usize,
    }
    struct PJRT_Client_LookupDevice_Args {
        struct_size: usize, extension_start: Ext, client: *mut PJRT_Client, id: c_int, device: *mut PJRT_Device,
    }
    struct PJRT_Client_AddressableMemories_Args {
        struct_size: usize, extension_start: Ext, client: *mut PJRT_Client,
        addressable_memories: *const *mut PJRT_Memory, num_addressable_memories: usize,
    }
    struct PJRT_Program {
        struct_size: usize, extension_start: Ext, code: *mut c_char, code_size: usize,
        format: *const c_char, format_size: usize,
    }
    struct PJRT_Client_Compile_Args {
        struct_size: usize, extension_start: Ext, client: *mut PJRT_Client, program: *const PJRT_Program,
        compile_options: *const c_char, compile_options_size: usize, executable: *mut PJRT_LoadedExecutable,
    }
    struct PJRT_Client_DefaultDeviceAssignment_Args {
        struct_size: usize, extension_start: Ext, client: *mut PJRT_Client, num_replicas: c_int,
        num_partitions: c_int, default_assignment_size: usize, default_assignment: *mut c_int,
    }
    struct PJRT_Client_BufferFromHostBuffer_Args {
        struct_size: usize, extension_start: Ext, client: *mut PJRT_Client, data: *const c_void,
        type_ as type: PJRT_Buffer_Type, dims: *const i64, num_dims: usize,
        byte_strides: *const i64, num_byte_strides: usize,
        host_buffer_semantics: PJRT_HostBufferSemantics, device: *mut PJRT_Device, memory: *mut PJRT_Memory,
        device_layout: *mut c_void, done_with_host_buffer: *mut PJRT_Event, buffer: *mut PJRT_Buffer,
    }

    struct PJRT_DeviceDescription_Id_Args {
        struct_size: usize, extension_start: Ext, device_description: *mut PJRT_DeviceDescription, id: c_int,
    }
    struct PJRT_DeviceDescription_ProcessIndex_Args {
        struct_size: usize, extension_start: Ext, device_description: *mut PJRT_DeviceDescription,
        process_index: c_int,
    }
    struct PJRT_DeviceDescription_Attributes_Args {
        struct_size: usize, extension_start: Ext, device_description: *mut PJRT_DeviceDescription,
        num_attributes: usize, attributes: *const PJRT_NamedValue,
    }
    struct PJRT_DeviceDescription_Kind_Args {
        struct_size: usize, extension_start: Ext, device_description: *mut PJRT_DeviceDescription,
        device_kind: *const c_char, device_kind_size: usize,
    }
    struct PJRT_DeviceDescription_DebugString_Args {
        struct_size: usize, extension_start: Ext, device_description: *mut PJRT_DeviceDescription,
        debug_string: *const c_char, debug_string_size: usize,
    }
    struct PJRT_DeviceDescription_ToString_Args {
        struct_size: usize, extension_start: Ext, device_description: *mut PJRT_DeviceDescription,
        to_string: *const c_char, to_string_size: usize,
    }
    struct PJRT_Device_GetDescription_Args {
        struct_size: usize, extension_start: Ext, device: *mut PJRT_Device,
        device_description: *mut PJRT_DeviceDescription,
    }
    struct PJRT_Device_IsAddressable_Args {
        struct_size: usize, extension_start: Ext, device: *mut PJRT_Device, is_addressable: bool,
    }
    struct PJRT_Device_LocalHardwareId_Args {
        struct_size: usize, extension_start: Ext, device: *mut PJRT_Device, local_hardware_id: c_int,
    }
    struct PJRT_Device_AddressableMemories_Args {
        struct_size: usize, extension_start: Ext, device: *mut PJRT_Device,
        memories: *const *mut PJRT_Memory, num_memories: usize,
    }
    struct PJRT_Device_DefaultMemory_Args {
        struct_size: usize, extension_start: Ext, device: *mut PJRT_Device, memory: *mut PJRT_Memory,
    }
    struct PJRT_Device_MemoryStats_Args {
        struct_size: usize, extension_start: Ext, device: *mut PJRT_Device,
        bytes_in_use: i64,
        peak_bytes_in_use: i64, peak_bytes_in_use_is_set: bool,
        num_allocs: i64, num_allocs_is_set: bool,
        largest_alloc_size: i64, largest_alloc_size_is_set: bool,
        bytes_limit: i64, bytes_limit_is_set: bool,
        bytes_reserved: i64, bytes_reserved_is_set: bool,
        peak_bytes_reserved: i64, peak_bytes_reserved_is_set: bool,
        bytes_reservable_limit: i64, bytes_reservable_limit_is_set: bool,
        largest_free_block_bytes: i64, largest_free_block_bytes_is_set: bool,
        pool_bytes: i64, pool_bytes_is_set: bool,
        peak_pool_bytes: i64, peak_pool_bytes_is_set: bool,
    }

    struct PJRT_Memory_Id_Args { struct_size: usize, extension_start: Ext, memory: *mut PJRT_Memory, id: c_int }
    struct PJRT_Memory_Kind_Args {
        struct_size: usize, extension_start: Ext, memory: *mut PJRT_Memory, kind: *const c_char, kind_size: usize,
    }
    struct PJRT_Memory_DebugString_Args {
        struct_size: usize, extension_start: Ext, memory: *mut PJRT_Memory,
        debug_string: *const c_char, debug_string_size: usize,
    }

    struct PJRT_Executable_Destroy_Args { struct_size: usize, extension_start: Ext, executable: *mut PJRT_Executable }
    struct PJRT_LoadedExecutable_Destroy_Args {
        struct_size: usize, extension_start: Ext, executable: *mut PJRT_LoadedExecutable,
    }
    struct PJRT_LoadedExecutable_GetExecutable_Args {
        struct_size: usize, extension_start: Ext, loaded_executable: *mut PJRT_LoadedExecutable,
        executable: *mut PJRT_Executable,
    }
    struct PJRT_Executable_Name_Args {
        struct_size: usize, extension_start: Ext, executable: *mut PJRT_Executable,
        executable_name: *const c_char, executable_name_size: usize,
    }
    struct PJRT_Executable_NumOutputs_Args {
        struct_size: usize, extension_start: Ext, executable: *mut PJRT_Executable, num_outputs: usize,
    }
    struct PJRT_Executable_OptimizedProgram_Args {
        struct_size: usize, extension_start: Ext, executable: *mut PJRT_Executable, program: *mut PJRT_Program,
    }
    struct PJRT_LoadedExecutable_AddressableDevices_Args {
        struct_size: usize, extension_start: Ext, executable: *mut PJRT_LoadedExecutable,
        addressable_devices: *const *mut PJRT_Device, num_addressable_devices: usize,
    }
    struct PJRT_ExecuteOptions {
        struct_size: usize, extension_start: Ext, send_callbacks: *mut *mut c_void,
        recv_callbacks: *mut *mut c_void, num_send_ops: usize, num_recv_ops: usize, launch_id: c_int,
        non_donatable_input_indices: *const i64, num_non_donatable_input_indices: usize,
        context: *mut PJRT_ExecuteContext, call_location: *const c_char, num_tasks: usize,
        task_ids: *mut c_int, incarnation_ids: *mut i64,
    }
    struct PJRT_LoadedExecutable_Execute_Args {
        struct_size: usize, extension_start: Ext, executable: *mut PJRT_LoadedExecutable,
        options: *mut PJRT_ExecuteOptions, argument_lists: *const *const *mut PJRT_Buffer,
        num_devices: usize, num_args: usize, output_lists: *const *mut *mut PJRT_Buffer,
        device_complete_events: *mut *mut PJRT_Event, execute_device: *mut PJRT_Device,
    }

    struct PJRT_Buffer_Destroy_Args { struct_size: usize, extension_start: Ext, buffer: *mut PJRT_Buffer }
    struct PJRT_Buffer_ElementType_Args {
        struct_size: usize, extension_start: Ext, buffer: *mut PJRT_Buffer, type_ as type: PJRT_Buffer_Type,
    }
    struct PJRT_Buffer_Dimensions_Args {
        struct_size: usize, extension_start: Ext, buffer: *mut PJRT_Buffer, dims: *const i64, num_dims: usize,
    }
    struct PJRT_Buffer_ToHostBuffer_Args {
        struct_size: usize, extension_start: Ext, src: *mut PJRT_Buffer, host_layout: *mut c_void,
        dst: *mut c_void, dst_size: usize, event: *mut PJRT_Event,
    }
    struct PJRT_Buffer_OnDeviceSizeInBytes_Args {
        struct_size: usize, extension_start: Ext, buffer: *mut PJRT_Buffer, on_device_size_in_bytes: usize,
    }
    struct PJRT_Buffer_Delete_Args { struct_size: usize, extension_start: Ext, buffer: *mut PJRT_Buffer }
    struct PJRT_Buffer_IsDeleted_Args {
        struct_size: usize, extension_start: Ext, buffer: *mut PJRT_Buffer, is_deleted: bool,
    }
    struct PJRT_Buffer_CopyToDevice_Args {
        struct_size: usize, extension_start: Ext, buffer: *mut PJRT_Buffer, dst_device: *mut PJRT_Device,
        dst_buffer: *mut PJRT_Buffer,
    }
    struct PJRT_Buffer_Device_Args {
        struct_size: usize, extension_start: Ext, buffer: *mut PJRT_Buffer, device: *mut PJRT_Device,
    }
    struct PJRT_Buffer_ReadyEvent_Args {
        struct_size: usize, extension_start: Ext, buffer: *mut PJRT_Buffer, event: *mut PJRT_Event,
    }
}

/// An entry of the function table. Every PJRT function takes a pointer to
/// its args struct; all but the two error accessors return a `PJRT_Error*`.
pub type Fn<A> = Option<unsafe extern "C" fn(args: *mut A) -> *mut PJRT_Error>;
pub type VoidFn<A> = Option<unsafe extern "C" fn(args: *mut A)>;
/// A table entry this crate never calls; declared to keep later offsets right.
pub type Unused = Option<unsafe extern "C" fn(args: *mut c_void) -> *mut PJRT_Error>;

/// Declares `PJRT_Api` in header order and its layout entry.
macro_rules! pjrt_api {
    ($( $name:ident : $ty:ty ),* $(,)?) => {
        #[repr(C)]
        pub struct PJRT_Api {
            pub struct_size: usize,
            pub extension_start: Ext,
            pub pjrt_api_version: PJRT_Api_Version,
            $( pub $name: $ty ),*
        }

        impl PJRT_Api {
            pub const STRUCT_SIZE: usize = max_end(&[
                $( core::mem::offset_of!(PJRT_Api, $name) + core::mem::size_of::<$ty>() ),*
            ]);
        }

        pub const API_LAYOUT: StructLayout = StructLayout {
            name: "PJRT_Api",
            struct_size: PJRT_Api::STRUCT_SIZE,
            fields: &[
                ("pjrt_api_version", core::mem::offset_of!(PJRT_Api, pjrt_api_version)),
                $( (stringify!($name), core::mem::offset_of!(PJRT_Api, $name)) ),*
            ],
        };
    };
}

pjrt_api! {
    PJRT_Error_Destroy: VoidFn<PJRT_Error_Destroy_Args>,
    PJRT_Error_Message: VoidFn<PJRT_Error_Message_Args>,
    PJRT_Error_GetCode: Fn<PJRT_Error_GetCode_Args>,
    PJRT_Plugin_Initialize: Fn<PJRT_Plugin_Initialize_Args>,
    PJRT_Plugin_Attributes: Fn<PJRT_Plugin_Attributes_Args>,
    PJRT_Event_Destroy: Fn<PJRT_Event_Destroy_Args>,
    PJRT_Event_IsReady: Fn<PJRT_Event_IsReady_Args>,
    PJRT_Event_Error: Unused,
    PJRT_Event_Await: Fn<PJRT_Event_Await_Args>,
    PJRT_Event_OnReady: Fn<PJRT_Event_OnReady_Args>,
    PJRT_Client_Create: Fn<PJRT_Client_Create_Args>,
    PJRT_Client_Destroy: Fn<PJRT_Client_Destroy_Args>,
    PJRT_Client_PlatformName: Fn<PJRT_Client_PlatformName_Args>,
    PJRT_Client_ProcessIndex: Fn<PJRT_Client_ProcessIndex_Args>,
    PJRT_Client_PlatformVersion: Fn<PJRT_Client_PlatformVersion_Args>,
    PJRT_Client_Devices: Fn<PJRT_Client_Devices_Args>,
    PJRT_Client_AddressableDevices: Fn<PJRT_Client_AddressableDevices_Args>,
    PJRT_Client_LookupDevice: Fn<PJRT_Client_LookupDevice_Args>,
    PJRT_Client_LookupAddressableDevice: Unused,
    PJRT_Client_AddressableMemories: Fn<PJRT_Client_AddressableMemories_Args>,
    PJRT_Client_Compile: Fn<PJRT_Client_Compile_Args>,
    PJRT_Client_DefaultDeviceAssignment: Fn<PJRT_Client_DefaultDeviceAssignment_Args>,
    PJRT_Client_BufferFromHostBuffer: Fn<PJRT_Client_BufferFromHostBuffer_Args>,
    PJRT_DeviceDescription_Id: Fn<PJRT_DeviceDescription_Id_Args>,
    PJRT_DeviceDescription_ProcessIndex: Fn<PJRT_DeviceDescription_ProcessIndex_Args>,
    PJRT_DeviceDescription_Attributes: Fn<PJRT_DeviceDescription_Attributes_Args>,
    PJRT_DeviceDescription_Kind: Fn<PJRT_DeviceDescription_Kind_Args>,
    PJRT_DeviceDescription_DebugString: Fn<PJRT_DeviceDescription_DebugString_Args>,
    PJRT_DeviceDescription_ToString: Fn<PJRT_DeviceDescription_ToString_Args>,
    PJRT_Device_GetDescription: Fn<PJRT_Device_GetDescription_Args>,
    PJRT_Device_IsAddressable: Fn<PJRT_Device_IsAddressable_Args>,
    PJRT_Device_LocalHardwareId: Fn<PJRT_Device_LocalHardwareId_Args>,
    PJRT_Device_AddressableMemories: Fn<PJRT_Device_AddressableMemories_Args>,
    PJRT_Device_DefaultMemory: Fn<PJRT_Device_DefaultMemory_Args>,
    PJRT_Device_MemoryStats: Fn<PJRT_Device_MemoryStats_Args>,
    PJRT_Memory_Id: Fn<PJRT_Memory_Id_Args>,
    PJRT_Memory_Kind: Fn<PJRT_Memory_Kind_Args>,
    PJRT_Memory_DebugString: Fn<PJRT_Memory_DebugString_Args>,
    PJRT_Memory_ToString: Unused,
    PJRT_Memory_AddressableByDevices: Unused,
    PJRT_Executable_Destroy: Fn<PJRT_Executable_Destroy_Args>,
    PJRT_Executable_Name: Fn<PJRT_Executable_Name_Args>,
    PJRT_Executable_NumReplicas: Unused,
    PJRT_Executable_NumPartitions: Unused,
    PJRT_Executable_NumOutputs: Fn<PJRT_Executable_NumOutputs_Args>,
    PJRT_Executable_SizeOfGeneratedCodeInBytes: Unused,
    PJRT_Executable_GetCostAnalysis: Unused,
    PJRT_Executable_OutputMemoryKinds: Unused,
    PJRT_Executable_OptimizedProgram: Fn<PJRT_Executable_OptimizedProgram_Args>,
    PJRT_Executable_Serialize: Unused,
    PJRT_LoadedExecutable_Destroy: Fn<PJRT_LoadedExecutable_Destroy_Args>,
    PJRT_LoadedExecutable_GetExecutable: Fn<PJRT_LoadedExecutable_GetExecutable_Args>,
    PJRT_LoadedExecutable_AddressableDevices: Fn<PJRT_LoadedExecutable_AddressableDevices_Args>,
    PJRT_LoadedExecutable_Delete: Unused,
    PJRT_LoadedExecutable_IsDeleted: Unused,
    PJRT_LoadedExecutable_Execute: Fn<PJRT_LoadedExecutable_Execute_Args>,
    PJRT_Executable_DeserializeAndLoad: Unused,
    PJRT_LoadedExecutable_Fingerprint: Unused,
    PJRT_Buffer_Destroy: Fn<PJRT_Buffer_Destroy_Args>,
    PJRT_Buffer_ElementType: Fn<PJRT_Buffer_ElementType_Args>,
    PJRT_Buffer_Dimensions: Fn<PJRT_Buffer_Dimensions_Args>,
    PJRT_Buffer_UnpaddedDimensions: Unused,
    PJRT_Buffer_DynamicDimensionIndices: Unused,
    PJRT_Buffer_GetMemoryLayout: Unused,
    PJRT_Buffer_OnDeviceSizeInBytes: Fn<PJRT_Buffer_OnDeviceSizeInBytes_Args>,
    PJRT_Buffer_Device: Fn<PJRT_Buffer_Device_Args>,
    PJRT_Buffer_Memory: Unused,
    PJRT_Buffer_Delete: Fn<PJRT_Buffer_Delete_Args>,
    PJRT_Buffer_IsDeleted: Fn<PJRT_Buffer_IsDeleted_Args>,
    PJRT_Buffer_CopyToDevice: Fn<PJRT_Buffer_CopyToDevice_Args>,
    PJRT_Buffer_ToHostBuffer: Fn<PJRT_Buffer_ToHostBuffer_Args>,
    PJRT_Buffer_IsOnCpu: Unused,
    PJRT_Buffer_ReadyEvent: Fn<PJRT_Buffer_ReadyEvent_Args>,
}
