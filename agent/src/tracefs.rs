//! Tracepoint record layouts from tracefs `format` files, so that the
//! tracepoint program reads fields at the offsets of the running kernel.

use std::{
    collections::HashMap,
    fs,
    path::{Path, PathBuf},
};

use qpwatch_common::{CmOp, TpLayout, TP_FIELD_ABSENT};
use thiserror::Error;

const TRACEFS_MOUNTS: [&str; 2] = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"];

#[derive(Debug, Error, PartialEq, Eq)]
pub enum TracefsError {
    #[error("tracefs not mounted (tried {})", TRACEFS_MOUNTS.join(", "))]
    NotMounted,
    #[error("cannot read {path}: {error}")]
    Read { path: PathBuf, error: String },
    #[error("{path}: no `ID:` line")]
    NoId { path: PathBuf },
    #[error("{path}: unparsable field line {line:?}")]
    BadField { path: PathBuf, line: String },
    #[error("tracepoint {tracepoint}: field {field} missing")]
    MissingField { tracepoint: String, field: String },
    #[error("tracepoint {tracepoint}: field {field} is {size} bytes, expected {expected}")]
    FieldSize {
        tracepoint: String,
        field: String,
        size: u32,
        expected: u32,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FieldInfo {
    pub offset: u32,
    pub size: u32,
}

/// A parsed `events/<category>/<name>/format` file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Format {
    pub id: u32,
    pub fields: HashMap<String, FieldInfo>,
}

/// The tracefs mount point, if any.
pub fn tracefs_root() -> Result<PathBuf, TracefsError> {
    TRACEFS_MOUNTS
        .iter()
        .map(PathBuf::from)
        .find(|p| p.join("events").is_dir())
        .ok_or(TracefsError::NotMounted)
}

pub fn read_format(root: &Path, category: &str, name: &str) -> Result<Format, TracefsError> {
    let path = root.join("events").join(category).join(name).join("format");
    let text = fs::read_to_string(&path).map_err(|e| TracefsError::Read {
        path: path.clone(),
        error: e.to_string(),
    })?;
    parse_format(&text, &path)
}

/// Parses lines like `field:u32 cm_id; offset:8; size:4; signed:0;` (tab-separated).
pub fn parse_format(text: &str, path: &Path) -> Result<Format, TracefsError> {
    let mut id = None;
    let mut fields = HashMap::new();
    for line in text.lines().map(str::trim) {
        if let Some(rest) = line.strip_prefix("ID:") {
            id = rest.trim().parse().ok();
            continue;
        }
        let Some(rest) = line.strip_prefix("field:") else {
            continue;
        };
        let bad = || TracefsError::BadField {
            path: path.to_owned(),
            line: line.to_owned(),
        };
        let mut parts = rest.split(';').map(str::trim);
        let decl = parts.next().ok_or_else(bad)?;
        let mut offset = None;
        let mut size = None;
        for part in parts {
            if let Some(v) = part.strip_prefix("offset:") {
                offset = v.parse().ok();
            } else if let Some(v) = part.strip_prefix("size:") {
                size = v.parse().ok();
            }
        }
        // `unsigned char srcaddr[28]` → srcaddr; `__data_loc char[] name` → name
        let last = decl.rsplit(' ').next().ok_or_else(bad)?;
        let name = last.split('[').next().unwrap_or(last);
        if name.is_empty() {
            return Err(bad());
        }
        fields.insert(
            name.to_owned(),
            FieldInfo {
                offset: offset.ok_or_else(bad)?,
                size: size.ok_or_else(bad)?,
            },
        );
    }
    Ok(Format {
        id: id.ok_or_else(|| TracefsError::NoId {
            path: path.to_owned(),
        })?,
        fields,
    })
}

/// An `rdma_cma:*` tracepoint the CM program handles, and the fields it reads.
#[derive(Debug, Clone, Copy)]
pub struct CmaTracepoint {
    pub name: &'static str,
    pub op: CmOp,
    pub qp_num: bool,
    pub event: bool,
    /// Name of the `int` status-like field.
    pub status: Option<&'static str>,
}

const fn tp(name: &'static str, op: CmOp) -> CmaTracepoint {
    CmaTracepoint {
        name,
        op,
        qp_num: false,
        event: false,
        status: None,
    }
}

const fn with_qp(mut t: CmaTracepoint) -> CmaTracepoint {
    t.qp_num = true;
    t
}

/// The rdma_cma tracepoints of drivers/infiniband/core/cma_trace.h that qpwatch uses.
pub const CMA_TRACEPOINTS: &[CmaTracepoint] = &[
    with_qp(tp("cm_send_req", CmOp::TpSendReq)),
    with_qp(tp("cm_send_rep", CmOp::TpSendRep)),
    tp("cm_send_rtu", CmOp::TpSendRtu),
    tp("cm_send_rej", CmOp::TpSendRej),
    tp("cm_send_mra", CmOp::TpSendMra),
    tp("cm_disconnect", CmOp::TpDisconnect),
    tp("cm_sent_dreq", CmOp::TpSentDreq),
    tp("cm_sent_drep", CmOp::TpSentDrep),
    tp("cm_id_destroy", CmOp::TpIdDestroy),
    CmaTracepoint {
        status: Some("rc"),
        ..with_qp(tp("cm_qp_create", CmOp::TpQpCreate))
    },
    with_qp(tp("cm_qp_destroy", CmOp::TpQpDestroy)),
    CmaTracepoint {
        event: true,
        status: Some("status"),
        ..tp("cm_event_handler", CmOp::TpEventHandler)
    },
    CmaTracepoint {
        event: true,
        status: Some("result"),
        ..tp("cm_event_done", CmOp::TpEventDone)
    },
    CmaTracepoint {
        event: true,
        ..tp("cm_req_handler", CmOp::TpReqHandler)
    },
];

fn offset_of(
    format: &Format,
    tracepoint: &str,
    field: &str,
    sizes: &[u32],
) -> Result<u16, TracefsError> {
    let info = format
        .fields
        .get(field)
        .ok_or_else(|| TracefsError::MissingField {
            tracepoint: tracepoint.to_owned(),
            field: field.to_owned(),
        })?;
    if !sizes.contains(&info.size) {
        return Err(TracefsError::FieldSize {
            tracepoint: tracepoint.to_owned(),
            field: field.to_owned(),
            size: info.size,
            expected: sizes[0],
        });
    }
    Ok(info.offset as u16)
}

/// The record layout the tracepoint program needs for `tp`.
pub fn cma_layout(tp: &CmaTracepoint, format: &Format) -> Result<TpLayout, TracefsError> {
    let absent = TP_FIELD_ABSENT;
    Ok(TpLayout {
        op: tp.op as u32,
        cm_id: offset_of(format, tp.name, "cm_id", &[4])?,
        qp_num: if tp.qp_num {
            offset_of(format, tp.name, "qp_num", &[4])?
        } else {
            absent
        },
        // `unsigned long event`: the program reads 8 bytes
        event: if tp.event {
            offset_of(format, tp.name, "event", &[8])?
        } else {
            absent
        },
        status: match tp.status {
            Some(field) => offset_of(format, tp.name, field, &[4])?,
            None => absent,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const CM_QP_CREATE: &str = "name: cm_qp_create
ID: 1574
format:
	field:unsigned short common_type;	offset:0;	size:2;	signed:0;
	field:unsigned char common_flags;	offset:2;	size:1;	signed:0;
	field:unsigned char common_preempt_count;	offset:3;	size:1;	signed:0;
	field:int common_pid;	offset:4;	size:4;	signed:1;

	field:u32 cm_id;	offset:8;	size:4;	signed:0;
	field:u32 pd_id;	offset:12;	size:4;	signed:0;
	field:u32 tos;	offset:16;	size:4;	signed:0;
	field:u32 qp_num;	offset:20;	size:4;	signed:0;
	field:u32 send_wr;	offset:24;	size:4;	signed:0;
	field:u32 recv_wr;	offset:28;	size:4;	signed:0;
	field:int rc;	offset:32;	size:4;	signed:1;
	field:unsigned long qp_type;	offset:40;	size:8;	signed:0;
	field:unsigned char srcaddr[28];	offset:48;	size:28;	signed:0;
	field:unsigned char dstaddr[28];	offset:76;	size:28;	signed:0;

print fmt: \"cm.id=%u\", REC->cm_id
";

    #[test]
    fn parses_a_real_format_file() {
        let f = parse_format(CM_QP_CREATE, Path::new("x")).unwrap();
        assert_eq!(f.id, 1574);
        assert_eq!(
            f.fields["rc"],
            FieldInfo {
                offset: 32,
                size: 4
            }
        );
        assert_eq!(
            f.fields["srcaddr"],
            FieldInfo {
                offset: 48,
                size: 28
            }
        );
        assert_eq!(f.fields["common_type"], FieldInfo { offset: 0, size: 2 });
    }

    #[test]
    fn builds_layouts_and_rejects_mismatches() {
        let f = parse_format(CM_QP_CREATE, Path::new("x")).unwrap();
        let qp_create = CMA_TRACEPOINTS
            .iter()
            .find(|t| t.name == "cm_qp_create")
            .unwrap();
        assert_eq!(
            cma_layout(qp_create, &f).unwrap(),
            TpLayout {
                op: CmOp::TpQpCreate as u32,
                cm_id: 8,
                qp_num: 20,
                event: TP_FIELD_ABSENT,
                status: 32
            }
        );
        let wants_event = CmaTracepoint {
            event: true,
            ..*qp_create
        };
        assert!(matches!(
            cma_layout(&wants_event, &f),
            Err(TracefsError::MissingField { .. })
        ));
        let mut wrong = f.clone();
        wrong.fields.get_mut("cm_id").unwrap().size = 8;
        assert!(matches!(
            cma_layout(qp_create, &wrong),
            Err(TracefsError::FieldSize { size: 8, .. })
        ));
    }

    #[test]
    fn rejects_garbage() {
        assert!(matches!(
            parse_format("name: x\nformat:\n", Path::new("x")),
            Err(TracefsError::NoId { .. })
        ));
        assert!(matches!(
            parse_format("ID: 1\n\tfield:int x;\tsize:4;\n", Path::new("x")),
            Err(TracefsError::BadField { .. })
        ));
    }

    /// Every tracepoint qpwatch uses, against the running kernel (VM suite).
    #[test]
    fn running_kernel_layouts() {
        let Ok(root) = tracefs_root() else {
            eprintln!("tracefs not mounted; covered by the VM suite");
            return;
        };
        if !root.join("events/rdma_cma").is_dir() {
            eprintln!("rdma_cma tracepoints not present; covered by the VM suite");
            return;
        }
        for tp in CMA_TRACEPOINTS {
            let format = read_format(&root, "rdma_cma", tp.name).unwrap();
            cma_layout(tp, &format).unwrap();
        }
    }
}
