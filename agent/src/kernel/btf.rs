//! A reader for the kernel's BPF Type Format (`/sys/kernel/btf/*`), just enough
//! to find struct member offsets and enum values.
//!
//! Module BTF is "split" BTF (Documentation/bpf/btf.rst): its type ids continue
//! after vmlinux's last id and its string offsets continue after vmlinux's string
//! section, so a module's types are only readable together with vmlinux.

use std::{collections::HashMap, sync::Arc};

use thiserror::Error;

const BTF_MAGIC: u16 = 0xeb9f;
const HEADER_MIN_LEN: usize = 24;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum BtfError {
    #[error("not BTF data (bad magic {0:#06x})")]
    BadMagic(u16),
    #[error("BTF data truncated at byte {0}")]
    Truncated(usize),
    #[error("unknown BTF type kind {kind} for type id {id}")]
    UnknownKind { id: u32, kind: u32 },
    #[error("BTF string offset {0} out of range")]
    BadString(u32),
    #[error("BTF type id {0} out of range")]
    BadTypeId(u32),
    #[error("struct {0} not found")]
    StructNotFound(String),
    #[error("field {field} not found in struct {structure}")]
    FieldNotFound { structure: String, field: String },
    #[error("field {field} of struct {structure} is a bitfield")]
    Bitfield { structure: String, field: String },
    #[error("{structure}.{field} is not a struct or union, cannot descend into it")]
    NotComposite { structure: String, field: String },
    #[error("enum {0} not found")]
    EnumNotFound(String),
}

/// A BTF type kind, as far as qpwatch needs to tell them apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Int,
    Ptr,
    Array,
    Struct,
    Union,
    Enum,
    Fwd,
    Typedef,
    Volatile,
    Const,
    Restrict,
    Func,
    FuncProto,
    Var,
    Datasec,
    Float,
    DeclTag,
    TypeTag,
    Enum64,
}

impl Kind {
    fn from_raw(raw: u32) -> Option<Self> {
        Some(match raw {
            1 => Kind::Int,
            2 => Kind::Ptr,
            3 => Kind::Array,
            4 => Kind::Struct,
            5 => Kind::Union,
            6 => Kind::Enum,
            7 => Kind::Fwd,
            8 => Kind::Typedef,
            9 => Kind::Volatile,
            10 => Kind::Const,
            11 => Kind::Restrict,
            12 => Kind::Func,
            13 => Kind::FuncProto,
            14 => Kind::Var,
            15 => Kind::Datasec,
            16 => Kind::Float,
            17 => Kind::DeclTag,
            18 => Kind::TypeTag,
            19 => Kind::Enum64,
            _ => return None,
        })
    }

    fn is_modifier(self) -> bool {
        matches!(
            self,
            Kind::Typedef | Kind::Volatile | Kind::Const | Kind::Restrict | Kind::TypeTag
        )
    }
}

#[derive(Debug, Clone)]
pub struct Member {
    pub name_off: u32,
    pub type_id: u32,
    pub bit_offset: u32,
    /// Non-zero for bitfields.
    pub bitfield_size: u32,
}

#[derive(Debug, Clone)]
struct Type {
    name_off: u32,
    kind: Kind,
    /// `size` for Int/Struct/Union/Enum/Float/Datasec, `type` for the rest.
    size_or_type: u32,
    members: Vec<Member>,
    enum_values: Vec<(u32, i64)>,
    /// Array element type and count.
    array: Option<(u32, u32)>,
}

/// The resolved location of a struct member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Field {
    pub offset: u32,
    pub size: u32,
}

/// Parsed BTF: vmlinux, or a module's split BTF over its vmlinux base.
#[derive(Debug)]
pub struct Btf {
    base: Option<Arc<Btf>>,
    /// Id of `types[0]`.
    first_id: u32,
    /// String offset of `strings[0]`.
    first_str: u32,
    types: Vec<Type>,
    strings: Vec<u8>,
    /// Name → ids of the named struct/union/enum types defined here (not in base).
    by_name: HashMap<String, Vec<u32>>,
}

struct Reader<'a> {
    data: &'a [u8],
    pos: usize,
}

impl Reader<'_> {
    fn u32(&mut self) -> Result<u32, BtfError> {
        let bytes = self
            .data
            .get(self.pos..self.pos + 4)
            .ok_or(BtfError::Truncated(self.pos))?;
        self.pos += 4;
        Ok(u32::from_le_bytes(bytes.try_into().expect("4 bytes")))
    }
}

fn le_u32(data: &[u8], at: usize) -> Result<u32, BtfError> {
    data.get(at..at + 4)
        .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
        .ok_or(BtfError::Truncated(at))
}

impl Btf {
    /// Parses base BTF (`/sys/kernel/btf/vmlinux`).
    pub fn parse(data: &[u8]) -> Result<Btf, BtfError> {
        Self::parse_inner(data, None)
    }

    /// Parses a module's split BTF (`/sys/kernel/btf/<module>`) on top of `base`.
    pub fn parse_split(data: &[u8], base: Arc<Btf>) -> Result<Btf, BtfError> {
        Self::parse_inner(data, Some(base))
    }

    fn parse_inner(data: &[u8], base: Option<Arc<Btf>>) -> Result<Btf, BtfError> {
        if data.len() < HEADER_MIN_LEN {
            return Err(BtfError::Truncated(data.len()));
        }
        let magic = u16::from_le_bytes([data[0], data[1]]);
        if magic != BTF_MAGIC {
            return Err(BtfError::BadMagic(magic));
        }
        let hdr_len = le_u32(data, 4)? as usize;
        let type_off = le_u32(data, 8)? as usize;
        let type_len = le_u32(data, 12)? as usize;
        let str_off = le_u32(data, 16)? as usize;
        let str_len = le_u32(data, 20)? as usize;

        let section = |off: usize, len: usize| {
            let start = hdr_len.checked_add(off).ok_or(BtfError::Truncated(off))?;
            let end = start.checked_add(len).ok_or(BtfError::Truncated(start))?;
            data.get(start..end).ok_or(BtfError::Truncated(end))
        };
        let type_data = section(type_off, type_len)?;
        let strings = section(str_off, str_len)?.to_vec();

        let (first_id, first_str) = match &base {
            Some(base) => (base.next_id(), base.next_str()),
            None => (1, 0),
        };

        let mut types = Vec::new();
        let mut r = Reader {
            data: type_data,
            pos: 0,
        };
        while r.pos < type_data.len() {
            let id = first_id + types.len() as u32;
            let name_off = r.u32()?;
            let info = r.u32()?;
            let size_or_type = r.u32()?;
            let vlen = info & 0xffff;
            let raw_kind = (info >> 24) & 0x1f;
            let kind_flag = info >> 31 == 1;
            let kind =
                Kind::from_raw(raw_kind).ok_or(BtfError::UnknownKind { id, kind: raw_kind })?;
            let mut ty = Type {
                name_off,
                kind,
                size_or_type,
                members: Vec::new(),
                enum_values: Vec::new(),
                array: None,
            };
            match kind {
                Kind::Int | Kind::Var | Kind::DeclTag => {
                    r.u32()?;
                }
                Kind::Array => {
                    let elem = r.u32()?;
                    let _index_type = r.u32()?;
                    let nelems = r.u32()?;
                    ty.array = Some((elem, nelems));
                }
                Kind::Struct | Kind::Union => {
                    ty.members.reserve(vlen as usize);
                    for _ in 0..vlen {
                        let name_off = r.u32()?;
                        let type_id = r.u32()?;
                        let offset = r.u32()?;
                        let (bit_offset, bitfield_size) = if kind_flag {
                            (offset & 0xff_ffff, offset >> 24)
                        } else {
                            (offset, 0)
                        };
                        ty.members.push(Member {
                            name_off,
                            type_id,
                            bit_offset,
                            bitfield_size,
                        });
                    }
                }
                Kind::Enum => {
                    for _ in 0..vlen {
                        let name_off = r.u32()?;
                        let raw = r.u32()?;
                        let value = if kind_flag {
                            i64::from(raw as i32)
                        } else {
                            i64::from(raw)
                        };
                        ty.enum_values.push((name_off, value));
                    }
                }
                Kind::Enum64 => {
                    for _ in 0..vlen {
                        let name_off = r.u32()?;
                        let lo = u64::from(r.u32()?);
                        let hi = u64::from(r.u32()?);
                        ty.enum_values.push((name_off, ((hi << 32) | lo) as i64));
                    }
                }
                Kind::FuncProto => {
                    for _ in 0..vlen {
                        r.u32()?;
                        r.u32()?;
                    }
                }
                Kind::Datasec => {
                    for _ in 0..vlen {
                        r.u32()?;
                        r.u32()?;
                        r.u32()?;
                    }
                }
                Kind::Ptr
                | Kind::Fwd
                | Kind::Typedef
                | Kind::Volatile
                | Kind::Const
                | Kind::Restrict
                | Kind::Func
                | Kind::Float
                | Kind::TypeTag => {}
            }
            types.push(ty);
        }

        let mut btf = Btf {
            base,
            first_id,
            first_str,
            types,
            strings,
            by_name: HashMap::new(),
        };
        let mut by_name: HashMap<String, Vec<u32>> = HashMap::new();
        for (index, ty) in btf.types.iter().enumerate() {
            if matches!(
                ty.kind,
                Kind::Struct | Kind::Union | Kind::Enum | Kind::Enum64
            ) && ty.name_off != 0
            {
                let name = btf.name(ty.name_off)?;
                by_name
                    .entry(name.to_owned())
                    .or_default()
                    .push(btf.first_id + index as u32);
            }
        }
        btf.by_name = by_name;
        Ok(btf)
    }

    fn next_id(&self) -> u32 {
        self.first_id + self.types.len() as u32
    }

    fn next_str(&self) -> u32 {
        self.first_str + self.strings.len() as u32
    }

    /// Number of types defined here (excluding the base).
    pub fn type_count(&self) -> usize {
        self.types.len()
    }

    fn name(&self, off: u32) -> Result<&str, BtfError> {
        if off < self.first_str {
            return match &self.base {
                Some(base) => base.name(off),
                None => Err(BtfError::BadString(off)),
            };
        }
        let start = (off - self.first_str) as usize;
        let rest = self.strings.get(start..).ok_or(BtfError::BadString(off))?;
        let end = rest
            .iter()
            .position(|&b| b == 0)
            .ok_or(BtfError::BadString(off))?;
        std::str::from_utf8(&rest[..end]).map_err(|_| BtfError::BadString(off))
    }

    fn type_by_id(&self, id: u32) -> Result<&Type, BtfError> {
        if id < self.first_id {
            return match &self.base {
                Some(base) => base.type_by_id(id),
                None => Err(BtfError::BadTypeId(id)),
            };
        }
        self.types
            .get((id - self.first_id) as usize)
            .ok_or(BtfError::BadTypeId(id))
    }

    /// Follows typedefs and qualifiers to the underlying type.
    fn resolve(&self, mut id: u32) -> Result<(u32, &Type), BtfError> {
        for _ in 0..32 {
            let ty = self.type_by_id(id)?;
            if !ty.kind.is_modifier() {
                return Ok((id, ty));
            }
            id = ty.size_or_type;
        }
        Err(BtfError::BadTypeId(id))
    }

    /// Size in bytes of type `id`.
    pub fn type_size(&self, id: u32) -> Result<u32, BtfError> {
        let (_, ty) = self.resolve(id)?;
        Ok(match ty.kind {
            Kind::Ptr => 8,
            Kind::Array => {
                let (elem, nelems) = ty.array.expect("array info");
                self.type_size(elem)? * nelems
            }
            _ => ty.size_or_type,
        })
    }

    /// Finds a named struct (or union) with members, here first and then in the base.
    pub fn find_struct(&self, name: &str) -> Option<u32> {
        let local = self.by_name.get(name).and_then(|ids| {
            ids.iter().copied().find(|&id| {
                self.type_by_id(id)
                    .map(|t| matches!(t.kind, Kind::Struct | Kind::Union))
                    .unwrap_or(false)
            })
        });
        local.or_else(|| self.base.as_ref().and_then(|b| b.find_struct(name)))
    }

    /// Byte offset and size of `path` (dot-separated, e.g. `res.id`) inside
    /// `structure`, looking through anonymous struct/union members.
    pub fn field(&self, structure: &str, path: &str) -> Result<Field, BtfError> {
        let mut type_id = self
            .find_struct(structure)
            .ok_or_else(|| BtfError::StructNotFound(structure.to_owned()))?;
        let mut offset_bits = 0u32;
        let mut size = 0;
        let mut walked = structure.to_owned();
        for component in path.split('.') {
            let (_, ty) = self.resolve(type_id)?;
            if !matches!(ty.kind, Kind::Struct | Kind::Union) {
                return Err(BtfError::NotComposite {
                    structure: structure.to_owned(),
                    field: walked,
                });
            }
            let member =
                self.find_member(type_id, component)?
                    .ok_or_else(|| BtfError::FieldNotFound {
                        structure: walked.clone(),
                        field: component.to_owned(),
                    })?;
            if member.bitfield_size != 0 {
                return Err(BtfError::Bitfield {
                    structure: walked,
                    field: component.to_owned(),
                });
            }
            offset_bits += member.bit_offset;
            type_id = member.type_id;
            size = self.type_size(type_id)?;
            walked = format!("{walked}.{component}");
        }
        if offset_bits % 8 != 0 {
            return Err(BtfError::Bitfield {
                structure: structure.to_owned(),
                field: path.to_owned(),
            });
        }
        Ok(Field {
            offset: offset_bits / 8,
            size,
        })
    }

    /// Finds `name` among the members of composite `type_id`, descending into
    /// anonymous members. The returned member's `bit_offset` is relative to
    /// `type_id`.
    fn find_member(&self, type_id: u32, name: &str) -> Result<Option<Member>, BtfError> {
        let (_, ty) = self.resolve(type_id)?;
        for member in &ty.members {
            if member.name_off != 0 {
                if self.name(member.name_off)? == name {
                    return Ok(Some(member.clone()));
                }
                continue;
            }
            let (_, inner) = self.resolve(member.type_id)?;
            if matches!(inner.kind, Kind::Struct | Kind::Union) {
                if let Some(mut found) = self.find_member(member.type_id, name)? {
                    found.bit_offset += member.bit_offset;
                    return Ok(Some(found));
                }
            }
        }
        Ok(None)
    }

    /// Values of a named enum, as (enumerator name, value).
    pub fn enum_values(&self, name: &str) -> Result<Vec<(String, i64)>, BtfError> {
        let local = self.by_name.get(name).and_then(|ids| {
            ids.iter().copied().find(|&id| {
                self.type_by_id(id)
                    .map(|t| matches!(t.kind, Kind::Enum | Kind::Enum64))
                    .unwrap_or(false)
            })
        });
        let Some(id) = local else {
            return match &self.base {
                Some(base) => base.enum_values(name),
                None => Err(BtfError::EnumNotFound(name.to_owned())),
            };
        };
        let ty = self.type_by_id(id)?;
        ty.enum_values
            .iter()
            .map(|&(off, value)| Ok((self.name(off)?.to_owned(), value)))
            .collect()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Builds BTF blobs by hand so the parser is tested on inputs with known answers.
    #[derive(Default)]
    pub(crate) struct BtfBuilder {
        types: Vec<u8>,
        strings: Vec<u8>,
        first_str: u32,
    }

    impl BtfBuilder {
        pub(crate) fn new() -> Self {
            Self {
                strings: vec![0],
                ..Default::default()
            }
        }

        pub(crate) fn split_over(base: &Btf) -> Self {
            Self {
                first_str: base.next_str(),
                ..Default::default()
            }
        }

        pub(crate) fn string(&mut self, s: &str) -> u32 {
            let off = self.first_str + self.strings.len() as u32;
            self.strings.extend_from_slice(s.as_bytes());
            self.strings.push(0);
            off
        }

        fn word(&mut self, w: u32) {
            self.types.extend_from_slice(&w.to_le_bytes());
        }

        fn header(&mut self, name: u32, kind: u32, vlen: u32, kind_flag: bool, st: u32) {
            self.word(name);
            self.word((u32::from(kind_flag) << 31) | (kind << 24) | vlen);
            self.word(st);
        }

        pub(crate) fn int(&mut self, name: &str, size: u32) {
            let n = self.string(name);
            self.header(n, 1, 0, false, size);
            self.word(size * 8);
        }

        pub(crate) fn ptr(&mut self, to: u32) {
            self.header(0, 2, 0, false, to);
        }

        pub(crate) fn array(&mut self, elem: u32, nelems: u32) {
            self.header(0, 3, 0, false, 0);
            self.word(elem);
            self.word(elem);
            self.word(nelems);
        }

        pub(crate) fn typedef(&mut self, name: &str, to: u32) {
            let n = self.string(name);
            self.header(n, 8, 0, false, to);
        }

        /// members: (name or "" for anonymous, type id, bit offset, bitfield size)
        pub(crate) fn composite(
            &mut self,
            union: bool,
            name: &str,
            size: u32,
            members: &[(&str, u32, u32, u32)],
        ) {
            let n = if name.is_empty() {
                0
            } else {
                self.string(name)
            };
            let kind_flag = members.iter().any(|m| m.3 != 0);
            let kind = if union { 5 } else { 4 };
            self.header(n, kind, members.len() as u32, kind_flag, size);
            for &(mname, ty, bits, bitfield) in members {
                let mn = if mname.is_empty() {
                    0
                } else {
                    self.string(mname)
                };
                self.word(mn);
                self.word(ty);
                self.word(if kind_flag {
                    (bitfield << 24) | bits
                } else {
                    bits
                });
            }
        }

        pub(crate) fn enumeration(&mut self, name: &str, values: &[(&str, u32)]) {
            let n = self.string(name);
            self.header(n, 6, values.len() as u32, false, 4);
            for &(vname, v) in values {
                let vn = self.string(vname);
                self.word(vn);
                self.word(v);
            }
        }

        pub(crate) fn build(&self) -> Vec<u8> {
            let mut out = Vec::new();
            out.extend_from_slice(&BTF_MAGIC.to_le_bytes());
            out.push(1);
            out.push(0);
            out.extend_from_slice(&24u32.to_le_bytes());
            out.extend_from_slice(&0u32.to_le_bytes());
            out.extend_from_slice(&(self.types.len() as u32).to_le_bytes());
            out.extend_from_slice(&(self.types.len() as u32).to_le_bytes());
            out.extend_from_slice(&(self.strings.len() as u32).to_le_bytes());
            out.extend_from_slice(&self.types);
            out.extend_from_slice(&self.strings);
            out
        }
    }

    /// A base with `u32` (id 1), `char` (2), and `struct list_head` (3).
    fn base() -> Arc<Btf> {
        let mut b = BtfBuilder::new();
        b.int("unsigned int", 4); // 1
        b.int("char", 1); // 2
        b.composite(
            false,
            "list_head",
            16,
            &[("next", 4, 0, 0), ("prev", 4, 64, 0)],
        ); // 3
        b.ptr(3); // 4
        Arc::new(Btf::parse(&b.build()).unwrap())
    }

    #[test]
    fn finds_plain_and_nested_fields() {
        let base = base();
        let mut m = BtfBuilder::split_over(&base);
        // ids continue after the base's 4 types
        m.typedef("u32", 1); // 5
        m.array(2, 64); // 6: char[64]
        m.composite(
            false,
            "restrack",
            8,
            &[("valid", 1, 0, 0), ("id", 5, 32, 0)],
        ); // 7
        m.composite(
            false,
            "thing",
            112,
            &[
                ("list", 3, 0, 0),
                ("name", 6, 128, 0),
                ("num", 5, 640, 0),
                ("res", 7, 704, 0),
            ],
        ); // 8
        let module = Btf::parse_split(&m.build(), base).unwrap();
        assert_eq!(
            module.field("thing", "num").unwrap(),
            Field {
                offset: 80,
                size: 4
            }
        );
        assert_eq!(
            module.field("thing", "name").unwrap(),
            Field {
                offset: 16,
                size: 64
            }
        );
        assert_eq!(
            module.field("thing", "res.id").unwrap(),
            Field {
                offset: 92,
                size: 4
            }
        );
        // a base struct, reached through the module
        assert_eq!(
            module.field("list_head", "prev").unwrap(),
            Field { offset: 8, size: 8 }
        );
    }

    #[test]
    fn looks_through_anonymous_unions() {
        let mut b = BtfBuilder::new();
        b.int("int", 4); // 1
        b.composite(true, "", 4, &[("a", 1, 0, 0), ("b", 1, 0, 0)]); // 2: anon union
        b.composite(false, "outer", 12, &[("x", 1, 0, 0), ("", 2, 64, 0)]); // 3
        let btf = Btf::parse(&b.build()).unwrap();
        assert_eq!(
            btf.field("outer", "b").unwrap(),
            Field { offset: 8, size: 4 }
        );
    }

    #[test]
    fn reports_missing_struct_field_and_bitfield() {
        let mut b = BtfBuilder::new();
        b.int("int", 4); // 1
        b.composite(false, "s", 8, &[("whole", 1, 0, 0), ("bits", 1, 32, 3)]); // 2
        let btf = Btf::parse(&b.build()).unwrap();
        assert_eq!(
            btf.field("nope", "x"),
            Err(BtfError::StructNotFound("nope".into()))
        );
        assert_eq!(
            btf.field("s", "missing"),
            Err(BtfError::FieldNotFound {
                structure: "s".into(),
                field: "missing".into()
            })
        );
        assert!(matches!(
            btf.field("s", "bits"),
            Err(BtfError::Bitfield { .. })
        ));
        assert!(matches!(
            btf.field("s", "whole.deeper"),
            Err(BtfError::NotComposite { .. })
        ));
    }

    #[test]
    fn reads_enum_values() {
        let mut b = BtfBuilder::new();
        b.enumeration("ib_qp_state", &[("IB_QPS_RESET", 0), ("IB_QPS_INIT", 1)]);
        let btf = Btf::parse(&b.build()).unwrap();
        assert_eq!(
            btf.enum_values("ib_qp_state").unwrap(),
            vec![
                ("IB_QPS_RESET".to_owned(), 0),
                ("IB_QPS_INIT".to_owned(), 1)
            ]
        );
    }

    #[test]
    fn rejects_garbage() {
        assert_eq!(Btf::parse(&[0; 8]).unwrap_err(), BtfError::Truncated(8));
        assert!(matches!(Btf::parse(&[0; 32]), Err(BtfError::BadMagic(0))));
        let mut blob = base_blob();
        blob.truncate(blob.len() - 3);
        assert!(matches!(Btf::parse(&blob), Err(BtfError::Truncated(_))));
    }

    fn base_blob() -> Vec<u8> {
        let mut b = BtfBuilder::new();
        b.int("unsigned int", 4);
        b.build()
    }

    /// The host kernel's own BTF: a real, large input with fields whose layout
    /// is fixed by the kernel ABI. Skipped where the host has no BTF.
    #[test]
    fn reads_host_vmlinux() {
        let Ok(data) = std::fs::read("/sys/kernel/btf/vmlinux") else {
            eprintln!("no /sys/kernel/btf/vmlinux on this host; skipping");
            return;
        };
        let btf = Btf::parse(&data).unwrap();
        assert!(btf.type_count() > 10_000);
        // struct list_head { next; prev; } and struct callback_head are ABI-stable shapes.
        assert_eq!(
            btf.field("list_head", "prev").unwrap(),
            Field { offset: 8, size: 8 }
        );
        // task_struct.comm is char[TASK_COMM_LEN].
        assert_eq!(btf.field("task_struct", "comm").unwrap().size, 16);
        // struct sockaddr_in: sin_family at 0 (2 bytes), sin_port at 2, sin_addr at 4.
        assert_eq!(
            btf.field("sockaddr_in", "sin_addr").unwrap(),
            Field { offset: 4, size: 4 }
        );
        let states = btf.enum_values("bpf_prog_type").unwrap();
        assert!(states.contains(&("BPF_PROG_TYPE_KPROBE".to_owned(), 2)));
    }
}
