//! The `bpf(2)` syscall: map create / update / lookup / delete and program load with the
//! verifier log returned in the error.

use crate::bpf::insn::EbpfInsn;
use std::ffi::CString;
use std::fmt;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_LOOKUP_ELEM: libc::c_long = 1;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_MAP_DELETE_ELEM: libc::c_long = 3;
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_ITER_CREATE: libc::c_long = 33;
const BPF_PROG_GET_NEXT_ID: libc::c_long = 11;
const BPF_PROG_GET_FD_BY_ID: libc::c_long = 13;
const BPF_MAP_GET_FD_BY_ID: libc::c_long = 14;
const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
/// Verifier log buffer size for a failed load (the kernel truncates beyond it).
const VERIFIER_LOG_BYTES: usize = 64 * 1024;

/// `BPF_MAP_TYPE_*` values corelocal uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum MapType {
    /// `BPF_MAP_TYPE_ARRAY`.
    Array = 2,
    /// `BPF_MAP_TYPE_PERCPU_ARRAY`: one value per possible CPU for each key.
    PercpuArray = 6,
    /// `BPF_MAP_TYPE_CPUMAP`.
    CpuMap = 16,
    /// `BPF_MAP_TYPE_REUSEPORT_SOCKARRAY`.
    ReuseportSockArray = 20,
}

/// `BPF_PROG_TYPE_*` values corelocal uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum ProgType {
    /// `BPF_PROG_TYPE_SOCKET_FILTER`.
    SocketFilter = 1,
    /// `BPF_PROG_TYPE_XDP`.
    Xdp = 6,
    /// `BPF_PROG_TYPE_SK_REUSEPORT`.
    SkReuseport = 21,
    /// `BPF_PROG_TYPE_TRACING` (e.g. a BPF iterator, with [`ATTACH_TRACE_ITER`]).
    Tracing = 26,
}

/// `BPF_SK_REUSEPORT_SELECT`: expected attach type of a plain select program.
pub const ATTACH_SK_REUSEPORT_SELECT: u32 = 39;
/// `BPF_SK_REUSEPORT_SELECT_OR_MIGRATE`.
pub const ATTACH_SK_REUSEPORT_SELECT_OR_MIGRATE: u32 = 40;
/// `BPF_TRACE_ITER`: expected attach type of an iterator program, and its link's attach type.
pub const ATTACH_TRACE_ITER: u32 = 28;
/// `BPF_XDP`: link attach type of an XDP program on a network interface.
pub const ATTACH_XDP: u32 = 37;
/// `XDP_FLAGS_SKB_MODE`: generic XDP (any interface; runs on the skb after allocation).
pub const XDP_FLAGS_SKB_MODE: u32 = 2;
/// `XDP_FLAGS_DRV_MODE`: native XDP in the driver (needs driver support).
pub const XDP_FLAGS_DRV_MODE: u32 = 4;
/// `BPF_ANY` update flag.
pub const BPF_ANY: u64 = 0;

/// A failed `bpf(2)` call, with the verifier's log when a program was rejected.
#[derive(Debug)]
pub struct BpfError {
    /// Which command failed.
    pub op: &'static str,
    /// The errno.
    pub source: io::Error,
    /// The verifier log (empty unless a program load failed).
    pub log: String,
}

impl fmt::Display for BpfError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "bpf {}: {}", self.op, self.source)?;
        if !self.log.is_empty() {
            write!(f, "\nverifier log:\n{}", self.log.trim_end())?;
        }
        Ok(())
    }
}

impl std::error::Error for BpfError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

impl BpfError {
    /// Whether the kernel refused for lack of privilege (EPERM/EACCES).
    pub fn is_permission(&self) -> bool {
        matches!(
            self.source.raw_os_error(),
            Some(libc::EPERM) | Some(libc::EACCES)
        )
    }
}

#[repr(C)]
#[derive(Default)]
struct MapCreateAttr {
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    map_flags: u32,
    inner_map_fd: u32,
    numa_node: u32,
    map_name: [u8; 16],
}

#[repr(C)]
#[derive(Default)]
struct MapElemAttr {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

#[repr(C)]
#[derive(Default)]
struct ProgLoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
}

#[repr(C)]
#[derive(Default)]
struct LinkCreateAttr {
    prog_fd: u32,
    target_ifindex: u32,
    attach_type: u32,
    flags: u32,
    /// The command's unions after `flags`; must be zero for XDP.
    _rest: [u64; 4],
}

/// `BPF_PROG_LOAD`'s attributes up to `log_true_size` (144 bytes), for a program that names
/// the kernel function or type it attaches to by BTF id (a tracing program, an iterator).
#[repr(C)]
#[derive(Default)]
struct ProgLoadBtfAttr {
    base: ProgLoadAttr,
    prog_btf_fd: u32,
    func_info_rec_size: u32,
    func_info: u64,
    func_info_cnt: u32,
    line_info_rec_size: u32,
    line_info: u64,
    line_info_cnt: u32,
    attach_btf_id: u32,
    /// attach_prog_fd, core_relo_cnt, fd_array, core_relos, core_relo_rec_size,
    /// log_true_size: zero.
    _rest: [u64; 4],
}

#[repr(C)]
#[derive(Default)]
struct IterCreateAttr {
    link_fd: u32,
    flags: u32,
}

fn sys_bpf<T>(cmd: libc::c_long, attr: &mut T) -> io::Result<libc::c_long> {
    // `attr` is a live #[repr(C)] bpf_attr prefix; the kernel reads at most size_of::<T>()
    // bytes, and every pointer inside it refers to a buffer the caller keeps alive for the call.
    // SAFETY: `attr` and what it points at are valid for the call (above).
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *mut T as *mut libc::c_void,
            std::mem::size_of::<T>() as libc::c_uint,
        )
    };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

fn name16(name: &str) -> [u8; 16] {
    let mut out = [0u8; 16];
    for (o, b) in out.iter_mut().zip(
        name.bytes()
            .filter(|b| b.is_ascii_alphanumeric() || *b == b'_')
            .take(15),
    ) {
        *o = b;
    }
    out
}

fn owned(fd: libc::c_long) -> OwnedFd {
    // SAFETY: the kernel just returned this new descriptor, which nothing else owns.
    unsafe { OwnedFd::from_raw_fd(fd as RawFd) }
}

/// A BPF map.
#[derive(Debug)]
pub struct Map {
    fd: OwnedFd,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
}

impl Map {
    /// Creates a map.
    pub fn create(
        map_type: MapType,
        key_size: u32,
        value_size: u32,
        max_entries: u32,
        name: &str,
    ) -> Result<Map, BpfError> {
        let mut attr = MapCreateAttr {
            map_type: map_type as u32,
            key_size,
            value_size,
            max_entries,
            map_name: name16(name),
            ..Default::default()
        };
        let fd = sys_bpf(BPF_MAP_CREATE, &mut attr).map_err(|source| BpfError {
            op: "map create",
            source,
            log: String::new(),
        })?;
        Ok(Map {
            fd: owned(fd),
            key_size,
            value_size,
            max_entries,
        })
    }

    /// The map's descriptor.
    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Number of entries the map was created with.
    pub fn max_entries(&self) -> u32 {
        self.max_entries
    }

    fn elem(
        &self,
        op: &'static str,
        cmd: libc::c_long,
        key: &[u8],
        value: Option<*mut u8>,
        flags: u64,
    ) -> Result<(), BpfError> {
        assert_eq!(key.len(), self.key_size as usize, "key size");
        let mut attr = MapElemAttr {
            map_fd: self.raw_fd() as u32,
            key: key.as_ptr() as u64,
            value: value.map_or(0, |v| v as u64),
            flags,
            ..Default::default()
        };
        sys_bpf(cmd, &mut attr)
            .map(|_| ())
            .map_err(|source| BpfError {
                op,
                source,
                log: String::new(),
            })
    }

    /// `map[key] = value`.
    pub fn update(&self, key: &[u8], value: &[u8], flags: u64) -> Result<(), BpfError> {
        assert_eq!(value.len(), self.value_size as usize, "value size");
        // The kernel only reads through the value pointer for an update.
        self.elem(
            "map update",
            BPF_MAP_UPDATE_ELEM,
            key,
            Some(value.as_ptr() as *mut u8),
            flags,
        )
    }

    /// `map[key]`, or `None` when the key has no entry (ENOENT).
    pub fn lookup(&self, key: &[u8]) -> Result<Option<Vec<u8>>, BpfError> {
        let mut value = vec![0u8; self.value_size as usize];
        match self.elem(
            "map lookup",
            BPF_MAP_LOOKUP_ELEM,
            key,
            Some(value.as_mut_ptr()),
            0,
        ) {
            Ok(()) => Ok(Some(value)),
            Err(e) if e.source.raw_os_error() == Some(libc::ENOENT) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Deletes `map[key]`.
    pub fn delete(&self, key: &[u8]) -> Result<(), BpfError> {
        self.elem("map delete", BPF_MAP_DELETE_ELEM, key, None, 0)
    }

    /// `map[key] = value` for u32 keys and values.
    pub fn update_u32(&self, key: u32, value: u32) -> Result<(), BpfError> {
        self.update(&key.to_ne_bytes(), &value.to_ne_bytes(), BPF_ANY)
    }

    /// `map[key]` for u32 keys and values.
    pub fn lookup_u32(&self, key: u32) -> Result<Option<u32>, BpfError> {
        Ok(self
            .lookup(&key.to_ne_bytes())?
            .map(|v| u32::from_ne_bytes([v[0], v[1], v[2], v[3]])))
    }
}

/// A loaded BPF program.
#[derive(Debug)]
pub struct Program {
    fd: OwnedFd,
}

impl Program {
    /// Loads a program; on rejection the error carries the verifier log.
    pub fn load(
        prog_type: ProgType,
        expected_attach_type: u32,
        insns: &[EbpfInsn],
        name: &str,
    ) -> Result<Program, BpfError> {
        let license = CString::new("GPL").expect("static string");
        let mut log = vec![0u8; VERIFIER_LOG_BYTES];
        let mut attr = prog_load_attr(
            prog_type,
            expected_attach_type,
            insns,
            name,
            &license,
            &mut log,
        );
        Self::loaded(sys_bpf(BPF_PROG_LOAD, &mut attr), &log)
    }

    /// Loads a program that attaches to the kernel object of BTF id `attach_btf_id` (a
    /// tracing program: for an iterator, `bpf_iter_NAME`'s id with [`ATTACH_TRACE_ITER`]); on
    /// rejection the error carries the verifier log.
    pub fn load_btf(
        prog_type: ProgType,
        expected_attach_type: u32,
        attach_btf_id: u32,
        insns: &[EbpfInsn],
        name: &str,
    ) -> Result<Program, BpfError> {
        let license = CString::new("GPL").expect("static string");
        let mut log = vec![0u8; VERIFIER_LOG_BYTES];
        let mut attr = ProgLoadBtfAttr {
            base: prog_load_attr(
                prog_type,
                expected_attach_type,
                insns,
                name,
                &license,
                &mut log,
            ),
            attach_btf_id,
            ..Default::default()
        };
        Self::loaded(sys_bpf(BPF_PROG_LOAD, &mut attr), &log)
    }

    fn loaded(rc: io::Result<libc::c_long>, log: &[u8]) -> Result<Program, BpfError> {
        match rc {
            Ok(fd) => Ok(Program { fd: owned(fd) }),
            Err(source) => {
                let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
                Err(BpfError {
                    op: "prog load",
                    source,
                    log: String::from_utf8_lossy(&log[..end]).into_owned(),
                })
            }
        }
    }

    /// The program's descriptor.
    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// `BPF_PROG_LOAD`'s attributes for `insns`, with the verifier log (level 1) into `log`.
fn prog_load_attr(
    prog_type: ProgType,
    expected_attach_type: u32,
    insns: &[EbpfInsn],
    name: &str,
    license: &CString,
    log: &mut [u8],
) -> ProgLoadAttr {
    ProgLoadAttr {
        prog_type: prog_type as u32,
        insn_cnt: insns.len() as u32,
        insns: insns.as_ptr() as u64,
        license: license.as_ptr() as u64,
        log_level: 1,
        log_size: log.len() as u32,
        log_buf: log.as_mut_ptr() as u64,
        prog_name: name16(name),
        expected_attach_type,
        ..Default::default()
    }
}

/// A BPF link (`BPF_LINK_CREATE`): the attachment lives as long as this value — dropping it
/// closes the last descriptor and the kernel detaches the program.
#[derive(Debug)]
pub struct Link {
    fd: OwnedFd,
}

impl Link {
    /// Attaches `program` to the interface `ifindex` with `attach_type` (e.g. [`ATTACH_XDP`])
    /// and `flags` (e.g. [`XDP_FLAGS_SKB_MODE`]).
    pub fn create(
        program: &Program,
        ifindex: u32,
        attach_type: u32,
        flags: u32,
    ) -> Result<Link, BpfError> {
        let mut attr = LinkCreateAttr {
            prog_fd: program.raw_fd() as u32,
            target_ifindex: ifindex,
            attach_type,
            flags,
            ..Default::default()
        };
        let fd = sys_bpf(BPF_LINK_CREATE, &mut attr).map_err(|source| BpfError {
            op: "link create",
            source,
            log: String::new(),
        })?;
        Ok(Link { fd: owned(fd) })
    }

    /// Opens a new run of the iterator this link attaches (`BPF_ITER_CREATE`): reading the
    /// returned descriptor to its end runs the program over every object once.
    pub fn iter_create(&self) -> Result<OwnedFd, BpfError> {
        let mut attr = IterCreateAttr {
            link_fd: self.raw_fd() as u32,
            flags: 0,
        };
        let fd = sys_bpf(BPF_ITER_CREATE, &mut attr).map_err(bpf_err("iter create"))?;
        Ok(owned(fd))
    }

    /// The link's descriptor.
    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

// ---- Finding loaded objects again (another process's programs and maps) -------------------

#[repr(C)]
#[derive(Default)]
struct GetIdAttr {
    id: u32,
    next_id: u32,
    open_flags: u32,
}

#[repr(C)]
struct InfoAttr {
    bpf_fd: u32,
    info_len: u32,
    info: u64,
}

/// Most map ids read from one program's info.
const PROG_MAP_IDS_MAX: usize = 64;

fn bpf_err(op: &'static str) -> impl FnOnce(io::Error) -> BpfError {
    move |source| BpfError {
        op,
        source,
        log: String::new(),
    }
}

/// Ids of all loaded BPF programs, in id order, at most `limit` (`BPF_PROG_GET_NEXT_ID`;
/// needs CAP_SYS_ADMIN).
pub fn prog_ids(limit: usize) -> Result<Vec<u32>, BpfError> {
    let mut ids = Vec::new();
    let mut attr = GetIdAttr::default();
    while ids.len() < limit {
        match sys_bpf(BPF_PROG_GET_NEXT_ID, &mut attr) {
            Ok(_) => {
                ids.push(attr.next_id);
                attr.id = attr.next_id;
            }
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => break,
            Err(e) => return Err(bpf_err("prog get next id")(e)),
        }
    }
    Ok(ids)
}

fn c_name(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

fn obj_info(fd: RawFd, buf: &mut [u64; 32], op: &'static str) -> Result<(), BpfError> {
    let mut attr = InfoAttr {
        bpf_fd: fd as u32,
        info_len: std::mem::size_of::<[u64; 32]>() as u32,
        info: buf.as_mut_ptr() as u64,
    };
    sys_bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr)
        .map(|_| ())
        .map_err(bpf_err(op))
}

fn u32_at(buf: &[u64; 32], off: usize) -> u32 {
    let word = buf[off / 8];
    if off % 8 == 0 {
        word as u32
    } else {
        (word >> 32) as u32
    }
}

fn bytes_at(buf: &[u64; 32], off: usize, len: usize) -> Vec<u8> {
    buf.iter()
        .flat_map(|w| w.to_ne_bytes())
        .skip(off)
        .take(len)
        .collect()
}

/// What `BPF_OBJ_GET_INFO_BY_FD` says about a program.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProgInfo {
    /// `BPF_PROG_TYPE_*`.
    pub prog_type: u32,
    /// The program's id.
    pub id: u32,
    /// The name it was loaded with (up to 15 bytes).
    pub name: String,
    /// Ids of the maps it uses (at most 64 read).
    pub map_ids: Vec<u32>,
}

/// What `BPF_OBJ_GET_INFO_BY_FD` says about a map.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapInfo {
    /// `BPF_MAP_TYPE_*`.
    pub map_type: u32,
    /// The map's id.
    pub id: u32,
    /// Key size in bytes.
    pub key_size: u32,
    /// Value size in bytes.
    pub value_size: u32,
    /// Number of entries.
    pub max_entries: u32,
    /// The name it was created with.
    pub name: String,
}

impl Program {
    /// Opens the loaded program with id `id` (`BPF_PROG_GET_FD_BY_ID`; needs CAP_SYS_ADMIN).
    pub fn from_id(id: u32) -> Result<Program, BpfError> {
        let mut attr = GetIdAttr {
            id,
            ..Default::default()
        };
        let fd = sys_bpf(BPF_PROG_GET_FD_BY_ID, &mut attr).map_err(bpf_err("prog get fd by id"))?;
        Ok(Program { fd: owned(fd) })
    }

    /// Type, id, name and map ids of the program.
    pub fn info(&self) -> Result<ProgInfo, BpfError> {
        let mut ids = [0u32; PROG_MAP_IDS_MAX];
        let mut buf = [0u64; 32];
        // struct bpf_prog_info: nr_map_ids @52 (u32), map_ids @56 (u64 pointer).
        buf[6] = (PROG_MAP_IDS_MAX as u64) << 32;
        buf[7] = ids.as_mut_ptr() as u64;
        obj_info(self.raw_fd(), &mut buf, "prog info")?;
        let nr = (u32_at(&buf, 52) as usize).min(PROG_MAP_IDS_MAX);
        Ok(ProgInfo {
            prog_type: u32_at(&buf, 0),
            id: u32_at(&buf, 4),
            name: c_name(&bytes_at(&buf, 64, 16)),
            map_ids: ids[..nr].to_vec(),
        })
    }
}

impl Map {
    /// Opens the map with id `id` (`BPF_MAP_GET_FD_BY_ID`; needs CAP_SYS_ADMIN); key and value
    /// sizes come from its info.
    pub fn from_id(id: u32) -> Result<(Map, MapInfo), BpfError> {
        let mut attr = GetIdAttr {
            id,
            ..Default::default()
        };
        let fd = sys_bpf(BPF_MAP_GET_FD_BY_ID, &mut attr).map_err(bpf_err("map get fd by id"))?;
        let fd = owned(fd);
        let info = map_info(fd.as_raw_fd())?;
        Ok((
            Map {
                fd,
                key_size: info.key_size,
                value_size: info.value_size,
                max_entries: info.max_entries,
            },
            info,
        ))
    }

    /// Type, id, sizes and name of the map.
    pub fn info(&self) -> Result<MapInfo, BpfError> {
        map_info(self.raw_fd())
    }

    /// For a per-CPU map: `map[key]` on each possible CPU (`possible_cpus` values, each
    /// `value_size` bytes), or `None` when the key has no entry.
    pub fn lookup_percpu(
        &self,
        key: &[u8],
        possible_cpus: usize,
    ) -> Result<Option<Vec<Vec<u8>>>, BpfError> {
        assert_eq!(key.len(), self.key_size as usize, "key size");
        // The kernel copies round_up(value_size, 8) bytes per possible CPU.
        let stride = (self.value_size as usize).div_ceil(8) * 8;
        let mut value = vec![0u8; stride * possible_cpus.max(1)];
        match self.elem(
            "map lookup",
            BPF_MAP_LOOKUP_ELEM,
            key,
            Some(value.as_mut_ptr()),
            0,
        ) {
            Ok(()) => Ok(Some(
                value
                    .chunks(stride)
                    .map(|c| c[..self.value_size as usize].to_vec())
                    .collect(),
            )),
            Err(e) if e.source.raw_os_error() == Some(libc::ENOENT) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

fn map_info(fd: RawFd) -> Result<MapInfo, BpfError> {
    let mut buf = [0u64; 32];
    obj_info(fd, &mut buf, "map info")?;
    Ok(MapInfo {
        map_type: u32_at(&buf, 0),
        id: u32_at(&buf, 4),
        key_size: u32_at(&buf, 8),
        value_size: u32_at(&buf, 12),
        max_entries: u32_at(&buf, 16),
        name: c_name(&bytes_at(&buf, 24, 16)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn attributes_have_the_kernel_layout() {
        assert_eq!(size_of::<ProgLoadAttr>(), 72);
        assert_eq!(offset_of!(ProgLoadAttr, expected_attach_type), 68);
        assert_eq!(size_of::<ProgLoadBtfAttr>(), 144);
        assert_eq!(offset_of!(ProgLoadBtfAttr, attach_btf_id), 108);
        assert_eq!(size_of::<LinkCreateAttr>(), 48);
        assert_eq!(size_of::<IterCreateAttr>(), 8);
    }
}
