//! Resolves the kernel struct offsets the eBPF programs need from the running
//! kernel's BTF, so that no offset is ever compiled in for one kernel.

use std::{
    collections::HashMap,
    fmt, fs,
    path::{Path, PathBuf},
    sync::Arc,
};

use qpwatch_common::{CmOffsets, KernelOffsets, RxeOffsets};
use thiserror::Error;

use crate::kernel::btf::{Btf, BtfError};

pub const DEFAULT_BTF_DIR: &str = "/sys/kernel/btf";

/// One struct member the programs read.
#[derive(Debug, Clone, Copy)]
pub struct FieldSpec {
    /// Module whose BTF defines the struct (`vmlinux` for the core kernel).
    pub module: &'static str,
    pub structure: &'static str,
    /// Dot-separated member path.
    pub path: &'static str,
    /// Size the program reads; the kernel's field must have exactly this size.
    pub size: u32,
}

impl fmt::Display for FieldSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.structure, self.path)
    }
}

const fn field(
    module: &'static str,
    structure: &'static str,
    path: &'static str,
    size: u32,
) -> FieldSpec {
    FieldSpec {
        module,
        structure,
        path,
        size,
    }
}

pub const IB_QP_DEVICE: FieldSpec = field("ib_core", "ib_qp", "device", 8);
pub const IB_QP_QP_NUM: FieldSpec = field("ib_core", "ib_qp", "qp_num", 4);
pub const IB_QP_QP_TYPE: FieldSpec = field("ib_core", "ib_qp", "qp_type", 4);
pub const IB_PD_DEVICE: FieldSpec = field("ib_core", "ib_pd", "device", 8);
/// `char name[IB_DEVICE_NAME_MAX]`.
pub const IB_DEVICE_NAME: FieldSpec = field(
    "ib_core",
    "ib_device",
    "name",
    qpwatch_common::DEVICE_NAME_LEN as u32,
);
pub const IB_QP_ATTR_QP_STATE: FieldSpec = field("ib_core", "ib_qp_attr", "qp_state", 4);
pub const IB_QP_INIT_ATTR_QP_TYPE: FieldSpec = field("ib_core", "ib_qp_init_attr", "qp_type", 4);
/// The remote side of a modify (peers).
pub const IB_QP_ATTR_DEST_QP_NUM: FieldSpec = field("ib_core", "ib_qp_attr", "dest_qp_num", 4);
pub const IB_QP_ATTR_AH_FLAGS: FieldSpec = field("ib_core", "ib_qp_attr", "ah_attr.ah_flags", 1);
/// `union ib_gid`: 16 raw bytes.
pub const IB_QP_ATTR_DGID: FieldSpec = field("ib_core", "ib_qp_attr", "ah_attr.grh.dgid", 16);

/// `char comm[TASK_COMM_LEN]`: the programs read the calling task's name
/// from it directly, without `bpf_get_current_comm()` (optional).
pub const TASK_COMM: FieldSpec = field(
    "vmlinux",
    "task_struct",
    "comm",
    qpwatch_common::COMM_LEN as u32,
);

/// `struct ib_event`: what a QP event handler is given.
pub const IB_EVENT_ELEMENT: FieldSpec = field("ib_core", "ib_event", "element", 8);
pub const IB_EVENT_EVENT: FieldSpec = field("ib_core", "ib_event", "event", 4);

/// soft-RoCE (drivers/infiniband/sw/rxe/rxe_verbs.h, rxe_queue.h).
pub const RXE_QP_IBQP: FieldSpec = field("rdma_rxe", "rxe_qp", "ibqp", 0);
pub const RXE_CQ_IBCQ: FieldSpec = field("rdma_rxe", "rxe_cq", "ibcq", 0);
pub const RXE_CQ_IS_USER: FieldSpec = field("rdma_rxe", "rxe_cq", "is_user", 1);
pub const IB_CQ_DEVICE: FieldSpec = field("ib_core", "ib_cq", "device", 8);
pub const RXE_CQE_IBWC_STATUS: FieldSpec = field("rdma_rxe", "rxe_cqe", "ibwc.status", 4);
pub const RXE_CQE_UIBWC_STATUS: FieldSpec = field("rdma_rxe", "rxe_cqe", "uibwc.status", 4);
pub const RXE_CQE_IBWC_QP: FieldSpec = field("rdma_rxe", "rxe_cqe", "ibwc.qp", 8);
pub const RXE_CQE_UIBWC_QP_NUM: FieldSpec = field("rdma_rxe", "rxe_cqe", "uibwc.qp_num", 4);

/// `rdma_id_private` and friends live in rdma_cm (drivers/infiniband/core/cma_priv.h).
pub const ID_PRIV_ID: FieldSpec = field("rdma_cm", "rdma_id_private", "id", 0);
pub const ID_PRIV_STATE: FieldSpec = field("rdma_cm", "rdma_id_private", "state", 4);
pub const ID_PRIV_QP_NUM: FieldSpec = field("rdma_cm", "rdma_id_private", "qp_num", 4);
pub const ID_PRIV_RES_ID: FieldSpec = field("rdma_cm", "rdma_id_private", "res.id", 4);
pub const ID_PRIV_RES_USER: FieldSpec = field("rdma_cm", "rdma_id_private", "res.user", 1);
pub const ID_PRIV_RES_VALID: FieldSpec = field("rdma_cm", "rdma_id_private", "res.valid", 1);
pub const ID_PRIV_DEVICE: FieldSpec = field("rdma_cm", "rdma_id_private", "id.device", 8);
pub const ID_PRIV_QP: FieldSpec = field("rdma_cm", "rdma_id_private", "id.qp", 8);
pub const ID_PRIV_QP_TYPE: FieldSpec = field("rdma_cm", "rdma_id_private", "id.qp_type", 4);
pub const CM_EVENT_EVENT: FieldSpec = field("rdma_cm", "rdma_cm_event", "event", 4);
pub const CM_EVENT_STATUS: FieldSpec = field("rdma_cm", "rdma_cm_event", "status", 4);
pub const IB_CM_ID_CONTEXT: FieldSpec = field("rdma_cm", "ib_cm_id", "context", 8);
pub const IB_CM_EVENT_EVENT: FieldSpec = field("rdma_cm", "ib_cm_event", "event", 4);

#[derive(Debug, Error)]
pub enum OffsetError {
    #[error("cannot read BTF {path}: {source} (kernel {kernel}; is the module loaded and CONFIG_DEBUG_INFO_BTF_MODULES set?)")]
    Read {
        path: PathBuf,
        kernel: String,
        source: std::io::Error,
    },
    #[error("cannot parse BTF {path}: {source} (kernel {kernel})")]
    Parse {
        path: PathBuf,
        kernel: String,
        source: Box<BtfError>,
    },
    #[error("kernel {kernel}: field {field} not found in {} BTF: {source}", field.module)]
    Missing {
        field: FieldSpec,
        kernel: String,
        source: Box<BtfError>,
    },
    #[error("kernel {kernel}: enum {name} not found in {module} BTF: {source}")]
    Enum {
        name: String,
        module: &'static str,
        kernel: String,
        source: Box<BtfError>,
    },
    #[error("kernel {kernel}: field {field} is {actual} bytes, qpwatch reads {expected}")]
    WrongSize {
        field: FieldSpec,
        kernel: String,
        actual: u32,
        expected: u32,
    },
    /// The kernel's types are not laid out as the programs assume.
    #[error("kernel {kernel}: {detail}")]
    Layout { kernel: String, detail: String },
}

/// BTF of the running kernel, loaded lazily per module.
pub struct KernelBtf {
    dir: PathBuf,
    kernel: String,
    vmlinux: Option<Arc<Btf>>,
    modules: HashMap<&'static str, Arc<Btf>>,
}

impl KernelBtf {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            kernel: kernel_release(),
            vmlinux: None,
            modules: HashMap::new(),
        }
    }

    pub fn kernel(&self) -> &str {
        &self.kernel
    }

    /// Drops every cached BTF (vmlinux and modules); the next lookup re-reads it.
    pub fn release(&mut self) {
        self.vmlinux = None;
        self.modules.clear();
    }

    /// Drops the cached BTF of an unloaded module (it is re-read when it returns).
    pub fn forget(&mut self, module: &str) {
        self.modules.remove(module);
    }

    fn load(&self, name: &str, base: Option<Arc<Btf>>) -> Result<Btf, OffsetError> {
        let path = self.dir.join(name);
        let data = fs::read(&path).map_err(|source| OffsetError::Read {
            path: path.clone(),
            kernel: self.kernel.clone(),
            source,
        })?;
        let parsed = match base {
            Some(base) => Btf::parse_split(&data, base),
            None => Btf::parse(&data),
        };
        parsed.map_err(|source| OffsetError::Parse {
            path,
            kernel: self.kernel.clone(),
            source: Box::new(source),
        })
    }

    fn vmlinux(&mut self) -> Result<Arc<Btf>, OffsetError> {
        if let Some(btf) = &self.vmlinux {
            return Ok(Arc::clone(btf));
        }
        let btf = Arc::new(self.load("vmlinux", None)?);
        self.vmlinux = Some(Arc::clone(&btf));
        Ok(btf)
    }

    /// BTF in which `module`'s types are visible. A module built into the kernel
    /// has no file of its own; its types are then in vmlinux.
    fn module(&mut self, module: &'static str) -> Result<Arc<Btf>, OffsetError> {
        let vmlinux = self.vmlinux()?;
        if module == "vmlinux" {
            return Ok(vmlinux);
        }
        if let Some(btf) = self.modules.get(module) {
            return Ok(Arc::clone(btf));
        }
        if !self.dir.join(module).exists() && vmlinux_has_module_types(&vmlinux, module) {
            return Ok(vmlinux);
        }
        let btf = Arc::new(self.load(module, Some(vmlinux))?);
        self.modules.insert(module, Arc::clone(&btf));
        Ok(btf)
    }

    /// Offset of one field, checked against the size the programs read.
    pub fn offset(&mut self, spec: FieldSpec) -> Result<u32, OffsetError> {
        let btf = self.module(spec.module)?;
        let found =
            btf.field(spec.structure, spec.path)
                .map_err(|source| OffsetError::Missing {
                    field: spec,
                    kernel: self.kernel.clone(),
                    source: Box::new(source),
                })?;
        // size 0: only the offset matters (container_of of an embedded struct)
        if spec.size != 0 && found.size != spec.size {
            return Err(OffsetError::WrongSize {
                field: spec,
                kernel: self.kernel.clone(),
                actual: found.size,
                expected: spec.size,
            });
        }
        Ok(found.offset)
    }

    /// All offsets of the QP lifecycle programs. The remote side of modifies
    /// (peers) is optional: without its fields `peers_valid` stays 0 and
    /// [`KernelBtf::peer_offsets`] says why.
    pub fn qp_offsets(&mut self) -> Result<KernelOffsets, OffsetError> {
        let mut offsets = KernelOffsets {
            ib_qp_device: self.offset(IB_QP_DEVICE)?,
            ib_qp_qp_num: self.offset(IB_QP_QP_NUM)?,
            ib_qp_qp_type: self.offset(IB_QP_QP_TYPE)?,
            ib_pd_device: self.offset(IB_PD_DEVICE)?,
            ib_device_name: self.offset(IB_DEVICE_NAME)?,
            ib_qp_attr_qp_state: self.offset(IB_QP_ATTR_QP_STATE)?,
            ib_qp_init_attr_qp_type: self.offset(IB_QP_INIT_ATTR_QP_TYPE)?,
            valid: 1,
            ..KernelOffsets::default()
        };
        if let Ok((dest_qp_num, ah_flags, dgid)) = self.peer_offsets() {
            offsets.ib_qp_attr_dest_qp_num = dest_qp_num;
            offsets.ib_qp_attr_ah_flags = ah_flags;
            offsets.ib_qp_attr_dgid = dgid;
            offsets.peers_valid = 1;
        }
        if let Ok((element, event)) = self.event_offsets() {
            offsets.ib_event_element = element;
            offsets.ib_event_event = event;
            offsets.events_valid = 1;
        }
        Ok(offsets)
    }

    /// Offsets of `ib_event.element` and `ib_event.event` (QP async events).
    pub fn event_offsets(&mut self) -> Result<(u32, u32), OffsetError> {
        Ok((self.offset(IB_EVENT_ELEMENT)?, self.offset(IB_EVENT_EVENT)?))
    }

    /// Offsets of the soft-RoCE programs (rdma_rxe must be loaded), and
    /// `IB_WC_WR_FLUSH_ERR` from `wc_status` (the names of `enum ib_wc_status`).
    pub fn rxe_offsets(&mut self, wc_status: &[Option<String>]) -> Result<RxeOffsets, OffsetError> {
        let status = self.offset(RXE_CQE_IBWC_STATUS)?;
        let user_status = self.offset(RXE_CQE_UIBWC_STATUS)?;
        if status != user_status {
            return Err(OffsetError::Layout {
                kernel: self.kernel.clone(),
                detail: format!(
                    "rxe_cqe.ibwc.status is at {status}, rxe_cqe.uibwc.status at {user_status}: \
                     the programs read one offset for both"
                ),
            });
        }
        let flush = wc_status
            .iter()
            .position(|name| name.as_deref() == Some("WR_FLUSH_ERR"))
            .and_then(|v| u32::try_from(v).ok())
            .ok_or_else(|| OffsetError::Layout {
                kernel: self.kernel.clone(),
                detail: "enum ib_wc_status has no IB_WC_WR_FLUSH_ERR".to_owned(),
            })?;
        Ok(RxeOffsets {
            rxe_qp_ibqp: self.offset(RXE_QP_IBQP)?,
            rxe_cq_ibcq: self.offset(RXE_CQ_IBCQ)?,
            rxe_cq_is_user: self.offset(RXE_CQ_IS_USER)?,
            ib_cq_device: self.offset(IB_CQ_DEVICE)?,
            rxe_cqe_status: status,
            rxe_cqe_ibwc_qp: self.offset(RXE_CQE_IBWC_QP)?,
            rxe_cqe_uibwc_qp_num: self.offset(RXE_CQE_UIBWC_QP_NUM)?,
            wc_flush_err: flush,
            valid: 1,
        })
    }

    /// Offsets of `ib_qp_attr.dest_qp_num`, `.ah_attr.ah_flags` and
    /// `.ah_attr.grh.dgid`.
    pub fn peer_offsets(&mut self) -> Result<(u32, u32, u32), OffsetError> {
        Ok((
            self.offset(IB_QP_ATTR_DEST_QP_NUM)?,
            self.offset(IB_QP_ATTR_AH_FLAGS)?,
            self.offset(IB_QP_ATTR_DGID)?,
        ))
    }

    /// Offsets of the RDMA CM programs (rdma_cm must be loaded).
    pub fn cm_offsets(&mut self) -> Result<CmOffsets, OffsetError> {
        Ok(CmOffsets {
            id_priv_id: self.offset(ID_PRIV_ID)?,
            id_priv_state: self.offset(ID_PRIV_STATE)?,
            id_priv_qp_num: self.offset(ID_PRIV_QP_NUM)?,
            id_priv_res_id: self.offset(ID_PRIV_RES_ID)?,
            id_priv_res_user: self.offset(ID_PRIV_RES_USER)?,
            id_priv_res_valid: self.offset(ID_PRIV_RES_VALID)?,
            id_priv_device: self.offset(ID_PRIV_DEVICE)?,
            id_priv_qp: self.offset(ID_PRIV_QP)?,
            id_priv_qp_type: self.offset(ID_PRIV_QP_TYPE)?,
            cm_event_event: self.offset(CM_EVENT_EVENT)?,
            cm_event_status: self.offset(CM_EVENT_STATUS)?,
            ib_cm_id_context: self.offset(IB_CM_ID_CONTEXT)?,
            ib_cm_event_event: self.offset(IB_CM_EVENT_EVENT)?,
            valid: 1,
        })
    }

    /// Enumerator names of `name` in `module`'s BTF, indexed by value, with
    /// `prefix` stripped (e.g. `RDMA_CM_` of `enum rdma_cm_state`). Values
    /// without an enumerator are `None`.
    pub fn enum_names(
        &mut self,
        module: &'static str,
        name: &str,
        prefix: &str,
    ) -> Result<Vec<Option<String>>, OffsetError> {
        let btf = self.module(module)?;
        let values = btf.enum_values(name).map_err(|source| OffsetError::Enum {
            name: name.to_owned(),
            module,
            kernel: self.kernel.clone(),
            source: Box::new(source),
        })?;
        let max = values
            .iter()
            .map(|(_, v)| *v)
            .filter(|v| (0..=4096).contains(v))
            .max()
            .unwrap_or(-1);
        let mut names = vec![None; (max + 1) as usize];
        for (enumerator, value) in values {
            if (0..=max).contains(&value) {
                names[value as usize] = Some(
                    enumerator
                        .strip_prefix(prefix)
                        .unwrap_or(&enumerator)
                        .to_owned(),
                );
            }
        }
        Ok(names)
    }
}

/// With `CONFIG_INFINIBAND=y` there is no `/sys/kernel/btf/ib_core`; the
/// structs are then part of vmlinux.
fn vmlinux_has_module_types(vmlinux: &Btf, module: &str) -> bool {
    let probe = match module {
        "ib_core" => "ib_qp",
        "rdma_cm" => "rdma_id_private",
        "rdma_rxe" => "rxe_qp",
        _ => return false,
    };
    vmlinux.find_struct(probe).is_some()
}

/// `uname -r` of the running kernel.
pub fn kernel_release() -> String {
    fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "unknown".to_owned())
}

/// Whether `dir` holds BTF for `module` (i.e. the module is loaded).
pub fn module_btf_present(dir: &Path, module: &str) -> bool {
    dir.join(module).exists()
}

/// Identifies one load of a kernel module: the inode number of its BTF file,
/// which the kernel creates anew at every load (btf_module_notify) from
/// cyclically allocated kernfs ids. `None` while the module is not loaded.
pub fn module_generation(dir: &Path, module: &str) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    fs::metadata(dir.join(module)).ok().map(|m| m.ino())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::btf::tests::BtfBuilder;

    /// A fake /sys/kernel/btf with a vmlinux and an ib_core whose layout the
    /// test chooses, so the expected offsets are known independently.
    fn fake_btf_dir(qp_num_bits: u32, qp_type_size: u32) -> tempfile::TempDir {
        fake_btf_dir_with(qp_num_bits, qp_type_size, false)
    }

    /// `with_remote`: ib_qp_attr also has `ah_attr` (with `grh.dgid` and
    /// `ah_flags`) and `dest_qp_num`.
    fn fake_btf_dir_with(
        qp_num_bits: u32,
        qp_type_size: u32,
        with_remote: bool,
    ) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let mut v = BtfBuilder::new();
        v.int("unsigned int", 4); // 1
        v.int("char", 1); // 2
        v.int("unsigned short", 2); // 3
        let vmlinux_blob = v.build();
        let vmlinux = Arc::new(Btf::parse(&vmlinux_blob).unwrap());
        fs::write(dir.path().join("vmlinux"), &vmlinux_blob).unwrap();

        let mut m = BtfBuilder::split_over(&vmlinux);
        m.ptr(6); // 4: struct ib_device *
        m.array(2, 64); // 5: char[64]
        m.composite(
            false,
            "ib_device",
            72,
            &[("_pad", 1, 0, 0), ("name", 5, 64, 0)],
        ); // 6
        let type_id = if qp_type_size == 4 { 1 } else { 3 };
        m.composite(
            false,
            "ib_qp",
            64,
            &[
                ("device", 4, 0, 0),
                ("qp_num", 1, qp_num_bits, 0),
                ("qp_type", type_id, qp_num_bits + 32, 0),
            ],
        );
        m.composite(
            false,
            "ib_pd",
            16,
            &[("usecnt", 1, 0, 0), ("device", 4, 64, 0)],
        );
        if with_remote {
            m.array(2, 16); // 9: union ib_gid as 16 bytes
            m.composite(false, "ib_global_route", 24, &[("dgid", 9, 0, 0)]); // 10
            m.composite(
                false,
                "rdma_ah_attr",
                40,
                &[("grh", 10, 0, 0), ("ah_flags", 2, 28 * 8, 0)],
            ); // 11
            m.composite(
                false,
                "ib_qp_attr",
                56,
                &[
                    ("qp_state", 1, 0, 0),
                    ("cur", 1, 32, 0),
                    ("ah_attr", 11, 64, 0),
                    ("dest_qp_num", 1, 48 * 8, 0),
                ],
            );
        } else {
            m.composite(
                false,
                "ib_qp_attr",
                8,
                &[("qp_state", 1, 0, 0), ("cur", 1, 32, 0)],
            );
        }
        m.composite(
            false,
            "ib_qp_init_attr",
            16,
            &[("ctx", 4, 0, 0), ("qp_type", 1, 96, 0)],
        );
        fs::write(dir.path().join("ib_core"), m.build()).unwrap();
        dir
    }

    #[test]
    fn resolves_qp_offsets_from_module_btf() {
        let dir = fake_btf_dir(256, 4);
        let offsets = KernelBtf::new(dir.path()).qp_offsets().unwrap();
        assert_eq!(
            offsets,
            KernelOffsets {
                ib_qp_device: 0,
                ib_qp_qp_num: 32,
                ib_qp_qp_type: 36,
                ib_pd_device: 8,
                ib_device_name: 8,
                ib_qp_attr_qp_state: 0,
                ib_qp_init_attr_qp_type: 12,
                valid: 1,
                ..KernelOffsets::default()
            }
        );
    }

    #[test]
    fn resolves_the_remote_side_of_a_modify_when_the_kernel_has_it() {
        let dir = fake_btf_dir_with(256, 4, true);
        let offsets = KernelBtf::new(dir.path()).qp_offsets().unwrap();
        assert_eq!(offsets.peers_valid, 1);
        assert_eq!(offsets.ib_qp_attr_dgid, 8);
        assert_eq!(offsets.ib_qp_attr_ah_flags, 8 + 28);
        assert_eq!(offsets.ib_qp_attr_dest_qp_num, 48);
    }

    #[test]
    fn without_the_remote_fields_peers_are_off_with_the_reason() {
        let dir = fake_btf_dir(256, 4);
        let mut btf = KernelBtf::new(dir.path());
        let offsets = btf.qp_offsets().unwrap();
        assert_eq!(offsets.peers_valid, 0);
        assert_eq!(offsets.valid, 1);
        let err = btf.peer_offsets().unwrap_err().to_string();
        assert!(err.contains("ib_qp_attr.dest_qp_num"), "{err}");
    }

    #[test]
    fn names_the_missing_field_and_kernel() {
        let dir = fake_btf_dir(256, 4);
        let mut btf = KernelBtf::new(dir.path());
        let missing = FieldSpec {
            module: "ib_core",
            structure: "ib_qp",
            path: "no_such_field",
            size: 4,
        };
        let err = btf.offset(missing).unwrap_err().to_string();
        assert!(err.contains("ib_qp.no_such_field"), "{err}");
        assert!(err.contains(&kernel_release()), "{err}");
    }

    #[test]
    fn rejects_a_field_of_the_wrong_size() {
        let dir = fake_btf_dir(256, 2);
        let err = KernelBtf::new(dir.path()).qp_offsets().unwrap_err();
        assert!(
            matches!(
                err,
                OffsetError::WrongSize {
                    actual: 2,
                    expected: 4,
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn says_when_the_module_is_not_loaded() {
        let dir = fake_btf_dir(256, 4);
        fs::remove_file(dir.path().join("ib_core")).unwrap();
        let err = KernelBtf::new(dir.path())
            .qp_offsets()
            .unwrap_err()
            .to_string();
        assert!(err.contains("ib_core"), "{err}");
        assert!(err.contains("is the module loaded"), "{err}");
    }

    /// `task_struct.comm` is 16 bytes at an 8-byte aligned offset in the
    /// running kernel (the host's and the VM's): the programs read it with
    /// two 8-byte loads.
    #[test]
    fn resolves_the_running_kernels_task_comm() {
        if !Path::new(DEFAULT_BTF_DIR).join("vmlinux").exists() {
            eprintln!("no vmlinux BTF on this host");
            return;
        }
        let offset = KernelBtf::new(DEFAULT_BTF_DIR).offset(TASK_COMM).unwrap();
        assert!(offset > 0 && offset.is_multiple_of(8), "{offset}");
    }

    /// In the VM (and on any RDMA host) the real ib_core BTF must resolve.
    #[test]
    fn resolves_running_kernel_ib_core_when_loaded() {
        if !module_btf_present(Path::new(DEFAULT_BTF_DIR), "ib_core") {
            eprintln!("ib_core not loaded on this host; covered by the VM suite");
            return;
        }
        let offsets = KernelBtf::new(DEFAULT_BTF_DIR).qp_offsets().unwrap();
        // ib_qp starts with `struct ib_device *device` in every kernel since 2.6.
        assert_eq!(offsets.ib_qp_device, 0);
        // the remote GID and QPN of a modify: in every kernel since 4.19
        assert_eq!(offsets.peers_valid, 1);
        assert!(offsets.ib_qp_attr_dgid > offsets.ib_qp_attr_qp_state);
        assert!(offsets.ib_qp_qp_num > 0 && offsets.ib_qp_qp_type > offsets.ib_qp_qp_num);
    }

    /// The RDMA netlink numbers qpwatch uses are the running kernel's (VM
    /// suite): `enum rdma_nldev_command` and `enum rdma_nldev_attr` in
    /// ib_core's BTF.
    #[test]
    fn netlink_numbers_are_the_running_kernels() {
        if !module_btf_present(Path::new(DEFAULT_BTF_DIR), "ib_core") {
            eprintln!("ib_core not loaded on this host; covered by the VM suite");
            return;
        }
        let mut btf = KernelBtf::new(DEFAULT_BTF_DIR);
        let names = btf.enum_names("ib_core", "rdma_nldev_command", "").unwrap();
        let attrs = btf.enum_names("ib_core", "rdma_nldev_attr", "").unwrap();
        for &(name, value) in crate::kernel::rdma::netlink::UAPI {
            let table = if name.starts_with("RDMA_NLDEV_CMD_") {
                &names
            } else {
                &attrs
            };
            assert_eq!(
                table.get(usize::from(value)).cloned().flatten().as_deref(),
                Some(name),
                "{name} is {value} in qpwatch"
            );
        }
    }

    /// soft-RoCE's offsets and the names of the QP event and completion
    /// status enums from the running kernel (VM suite).
    #[test]
    fn resolves_running_kernel_rxe_when_loaded() {
        if !module_btf_present(Path::new(DEFAULT_BTF_DIR), "rdma_rxe") {
            eprintln!("rdma_rxe not loaded on this host; covered by the VM suite");
            return;
        }
        let mut btf = KernelBtf::new(DEFAULT_BTF_DIR);
        let wc_status = btf.enum_names("ib_core", "ib_wc_status", "IB_WC_").unwrap();
        assert_eq!(wc_status[0].as_deref(), Some("SUCCESS"));
        assert!(wc_status.iter().flatten().any(|s| s == "RETRY_EXC_ERR"));
        let rxe = btf.rxe_offsets(&wc_status).unwrap();
        assert_eq!(
            wc_status[rxe.wc_flush_err as usize].as_deref(),
            Some("WR_FLUSH_ERR")
        );
        assert!(rxe.rxe_cq_is_user > rxe.rxe_cq_ibcq);
        let events = btf
            .enum_names("ib_core", "ib_event_type", "IB_EVENT_")
            .unwrap();
        assert!(events.iter().flatten().any(|s| s == "QP_FATAL"));
        assert!(events.iter().flatten().any(|s| s == "SQ_DRAINED"));
        let (element, event) = btf.event_offsets().unwrap();
        assert!(event > element);
    }

    /// Same for rdma_cm (VM suite): rdma_id_private embeds the rdma_cm_id first.
    #[test]
    fn resolves_running_kernel_rdma_cm_when_loaded() {
        if !module_btf_present(Path::new(DEFAULT_BTF_DIR), "rdma_cm") {
            eprintln!("rdma_cm not loaded on this host; covered by the VM suite");
            return;
        }
        let mut btf = KernelBtf::new(DEFAULT_BTF_DIR);
        let cm = btf.cm_offsets().unwrap();
        assert_eq!(cm.id_priv_id, 0);
        assert!(cm.id_priv_res_id > cm.id_priv_qp_num);
        let states = btf
            .enum_names("rdma_cm", "rdma_cm_state", "RDMA_CM_")
            .unwrap();
        assert_eq!(states[0].as_deref(), Some("IDLE"));
        assert!(states.iter().flatten().any(|s| s == "LISTEN"));
    }
}
