//! The same-host path's files: the sender writes a payload into a file of
//! the shared-memory folder (a tmpfs: the pages are memory shared through
//! the page cache) and names it in the header; the receiver reads it.
//!
//! Invariants:
//! 1. A file (`tessel-{pid}-{n}`) belongs to its sender and serves one
//!    transfer at a time; acknowledged, it returns to the sender's pool and
//!    is overwritten in place by a later payload of the same length.
//! 2. No file outlives its process: failed transfers' files are removed, the
//!    pool keeps at most [`MAX_FREE`], and the next pool sweeps dead pids'.
//! 3. A lent file is mapped read-only by the receiver; the sender neither
//!    writes nor shortens it until the acknowledgement, sent once unmapped.
//! 4. An arena (`ShmArena`) is a communicator's standing file, mapped for its
//!    life and never resized; who touches which bytes when is collective
//!    invariant 8, and mappings hand out only the ranges asked for.

// The one module of this crate with `unsafe`: mapping files (`mmap`,
// `munmap`) and reserving their pages (`posix_fallocate`).
#![allow(unsafe_code)]

use std::collections::HashMap;
use std::fs::File;
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::error::{Result, TransferError};
use crate::header::{check_shm_name, SHM_PREFIX};

/// Most idle files a pool keeps.
pub const MAX_FREE: usize = 64;

/// A file carrying one payload.
pub(crate) struct ShmFile {
    pub name: String,
    file: File,
    len: u64,
}

/// The process's file counter (invariant 1).
static NEXT_FILE: AtomicU64 = AtomicU64::new(0);

pub(crate) struct ShmPool {
    dir: PathBuf,
    free: Mutex<HashMap<u64, Vec<ShmFile>>>,
}

impl ShmPool {
    pub(crate) fn new(dir: PathBuf) -> ShmPool {
        sweep_dead(&dir);
        ShmPool {
            dir,
            free: Mutex::new(HashMap::new()),
        }
    }

    /// A file holding `data`, the concatenation of its pieces (invariant
    /// 1).
    pub(crate) fn write<'a>(
        &self,
        data: impl Iterator<Item = &'a [u8]> + Clone,
    ) -> std::io::Result<ShmFile> {
        let len = data.clone().map(|p| p.len() as u64).sum();
        let reused = self
            .free
            .lock()
            .expect("not poisoned")
            .get_mut(&len)
            .and_then(Vec::pop);
        let f = match reused {
            Some(f) => f,
            None => {
                let (name, file) = create_file(&self.dir)?;
                ShmFile { name, file, len }
            }
        };
        let mut at = 0;
        for piece in data {
            if let Err(e) = f.file.write_all_at(piece, at) {
                self.release(f, false);
                return Err(e);
            }
            at += piece.len() as u64;
        }
        Ok(f)
    }

    /// Back to the pool after an acknowledged transfer, else removed
    /// (invariant 2).
    pub(crate) fn release(&self, f: ShmFile, delivered: bool) {
        if delivered {
            let mut free = self.free.lock().expect("not poisoned");
            if free.values().map(Vec::len).sum::<usize>() < MAX_FREE {
                free.entry(f.len).or_default().push(f);
                return;
            }
        }
        let _ = std::fs::remove_file(self.dir.join(&f.name));
    }
}

impl Drop for ShmPool {
    fn drop(&mut self) {
        let free = std::mem::take(&mut *self.free.lock().expect("not poisoned"));
        for f in free.into_values().flatten() {
            let _ = std::fs::remove_file(self.dir.join(&f.name));
        }
    }
}

/// A new file of this process in `dir`, named so that [`sweep_dead`]
/// finds it if the process dies (invariant 1).
fn create_file(dir: &Path) -> std::io::Result<(String, File)> {
    let name = format!(
        "{SHM_PREFIX}{}-{}",
        std::process::id(),
        NEXT_FILE.fetch_add(1, Ordering::Relaxed)
    );
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(dir.join(&name))?;
    Ok((name, file))
}

/// Removes `tessel-{pid}-…` files of processes that no longer exist.
fn sweep_dead(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.filter_map(std::result::Result::ok) {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix(SHM_PREFIX)
            .and_then(|rest| rest.split('-').next())
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

fn failure(path: &Path, reason: String) -> TransferError {
    TransferError::Stream {
        peer: "incoming".into(),
        reason: format!("shared memory {}: {reason}", path.display()),
    }
}

/// Opens the file a peer named in `dir`, after checking the name's form;
/// with its path and length.
fn open_named(dir: &Path, name: &str) -> Result<(File, PathBuf, u64)> {
    check_shm_name(name)?;
    let path = dir.join(name);
    let f = File::open(&path).map_err(|e| failure(&path, e.to_string()))?;
    let len = f
        .metadata()
        .map_err(|e| failure(&path, e.to_string()))?
        .len();
    Ok((f, path, len))
}

/// Opens the file a validated header names and checks its length against
/// the header's.
fn open_payload(dir: &Path, name: &str, byte_len: u64) -> Result<(File, PathBuf)> {
    let (f, path, len) = open_named(dir, name)?;
    if len != byte_len {
        return Err(failure(
            &path,
            format!("{len} bytes, the header says {byte_len}"),
        ));
    }
    Ok((f, path))
}

/// Reads the payload a validated header names (the receiver's side) into
/// `data`, an empty buffer with room for it.
pub(crate) fn read(dir: &Path, name: &str, byte_len: u64, mut data: Vec<u8>) -> Result<Vec<u8>> {
    let (f, path) = open_payload(dir, name, byte_len)?;
    let fail = |reason: String| failure(&path, reason);
    // Read into reserved capacity: no zero-filling pass before the copy.
    data.reserve_exact(byte_len as usize);
    f.take(byte_len)
        .read_to_end(&mut data)
        .map_err(|e| fail(e.to_string()))?;
    if data.len() as u64 != byte_len {
        return Err(fail(format!("cut short at {} bytes", data.len())));
    }
    Ok(data)
}

/// A live shared mapping of a file, unmapped when dropped (the one place
/// that unmaps), then `on_unmap` fires.
struct Mapped {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
    on_unmap: Option<tokio::sync::oneshot::Sender<()>>,
}

// SAFETY: the mapping is owned by this value alone; its bytes are reached
// only through `bytes` (shared, read) and `bytes_mut` (`&mut self`), so
// moving it to or sharing it with another thread adds no aliasing.
unsafe impl Send for Mapped {}
// SAFETY: as above: `&Mapped` only reads.
unsafe impl Sync for Mapped {}

impl Mapped {
    /// Maps the first `len` (> 0) bytes of `f`, shared, with its pages
    /// populated; read-write when `write`.
    fn new(f: &File, len: usize, write: bool) -> std::io::Result<Mapped> {
        use std::os::fd::AsRawFd;
        let prot = if write {
            libc::PROT_READ | libc::PROT_WRITE
        } else {
            libc::PROT_READ
        };
        // SAFETY: a fresh shared mapping of an open file descriptor at
        // least `len` bytes long (every caller checked or set the length);
        // the kernel picks the address, and the result is checked against
        // MAP_FAILED before use. Closing the file afterwards keeps the
        // mapping.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                prot,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                f.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let ptr = std::ptr::NonNull::new(ptr.cast::<u8>())
            .ok_or_else(|| std::io::Error::other("mmap returned null"))?;
        Ok(Mapped {
            ptr,
            len,
            on_unmap: None,
        })
    }

    fn check(&self, range: &std::ops::Range<usize>) -> Result<()> {
        if range.start > range.end || range.end > self.len {
            return Err(TransferError::InvalidArgument(format!(
                "bytes {range:?} of a {}-byte mapping",
                self.len
            )));
        }
        Ok(())
    }

    /// The bytes of `range`, or an error if it is not inside the mapping.
    fn bytes(&self, range: std::ops::Range<usize>) -> Result<&[u8]> {
        self.check(&range)?;
        // SAFETY: `ptr` is a live mapping of `len` bytes, unmapped only in
        // `drop`, of a file that never shrinks while mapped (invariants 3
        // and 4); the range lies inside it; nobody writes these bytes while
        // they may be read (invariant 3: the sender waits for the release;
        // invariant 4: the collectives' protocol).
        Ok(unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().add(range.start), range.len()) })
    }

    /// The bytes of `range` of a read-write mapping, or an error if it is
    /// not inside it.
    fn bytes_mut(&mut self, range: std::ops::Range<usize>) -> Result<&mut [u8]> {
        self.check(&range)?;
        // SAFETY: as in `bytes`, and the mapping is read-write (only
        // `ShmArena` calls this, on its own file); `&mut self` makes this
        // the only reference this process holds into it, and peers map it
        // read-only.
        Ok(unsafe {
            std::slice::from_raw_parts_mut(self.ptr.as_ptr().add(range.start), range.len())
        })
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are exactly what `mmap` returned and this is
        // the only unmap; no slice of it outlives the borrow that made it.
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len);
        }
        if let Some(tx) = self.on_unmap.take() {
            let _ = tx.send(());
        }
    }
}

/// A lent payload mapped read-only (invariant 3). Dropping it unmaps the
/// file and tells the receiving stream that the sender may have it back.
pub(crate) struct ShmMapping(Mapped);

impl std::ops::Deref for ShmMapping {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        self.0.bytes(0..self.0.len).expect("the whole mapping")
    }
}

/// Maps the lent payload a validated header names (the receiver's side of
/// invariant 3), with a receiver that fires when the mapping is dropped. A
/// zero-byte payload has nothing to map and comes back as `None` (the
/// caller holds no file then).
pub(crate) fn map(
    dir: &Path,
    name: &str,
    byte_len: u64,
) -> Result<Option<(ShmMapping, tokio::sync::oneshot::Receiver<()>)>> {
    let (f, path) = open_payload(dir, name, byte_len)?;
    let fail = |reason: String| failure(&path, reason);
    if byte_len == 0 {
        return Ok(None);
    }
    let len = usize::try_from(byte_len).map_err(|_| fail(format!("{byte_len} bytes")))?;
    let mut mapped = Mapped::new(&f, len, false).map_err(|e| fail(format!("mmap: {e}")))?;
    let (released, on_release) = tokio::sync::oneshot::channel();
    mapped.on_unmap = Some(released);
    Ok(Some((ShmMapping(mapped), on_release)))
}

/// A communicator's own arena (invariant 4): a file of `len` bytes mapped
/// read-write; dropping it unmaps and removes the file (peers' mappings
/// stay valid until they drop them).
pub(crate) struct ShmArena {
    name: String,
    path: PathBuf,
    map: Mapped,
}

impl ShmArena {
    /// A new arena of `len` (> 0) bytes in `dir`, its pages allocated:
    /// a tmpfs without room for them fails here, with `ENOSPC`, instead of
    /// raising `SIGBUS` at a later write (a container's `/dev/shm` is often
    /// 64 MiB).
    pub(crate) fn create(dir: &Path, len: usize) -> std::io::Result<ShmArena> {
        use std::os::fd::AsRawFd;
        if len == 0 {
            return Err(std::io::Error::other("an arena holds at least one byte"));
        }
        let (name, file) = create_file(dir)?;
        let path = dir.join(&name);
        let size = libc::off_t::try_from(len).map_err(std::io::Error::other);
        let mapped = size
            .and_then(|size| {
                // SAFETY: plain syscall on an open descriptor; no memory is
                // passed.
                match unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, size) } {
                    0 => Ok(()),
                    code => Err(std::io::Error::from_raw_os_error(code)),
                }
            })
            .and_then(|()| Mapped::new(&file, len, true));
        match mapped {
            Ok(map) => Ok(ShmArena { name, path, map }),
            Err(e) => {
                let _ = std::fs::remove_file(&path);
                Err(e)
            }
        }
    }

    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    pub(crate) fn len(&self) -> usize {
        self.map.len
    }

    /// The bytes of `range` (which must lie inside the arena).
    pub(crate) fn region(&self, range: std::ops::Range<usize>) -> &[u8] {
        self.map.bytes(range).expect("a range inside the arena")
    }

    /// The bytes of `range` (which must lie inside the arena).
    pub(crate) fn region_mut(&mut self, range: std::ops::Range<usize>) -> &mut [u8] {
        self.map.bytes_mut(range).expect("a range inside the arena")
    }
}

impl Drop for ShmArena {
    fn drop(&mut self) {
        // The mapping goes with the fields; the name can go first.
        let _ = std::fs::remove_file(&self.path);
    }
}

/// A peer's arena mapped read-only (invariant 4).
pub(crate) struct PeerArena {
    name: String,
    map: Mapped,
}

impl PeerArena {
    /// Maps the arena a peer named, after checking the name and that it
    /// holds at least `min_len` (> 0) bytes.
    pub(crate) fn open(dir: &Path, name: &str, min_len: usize) -> Result<PeerArena> {
        let (f, path, len) = open_named(dir, name)?;
        let fail = |reason: String| failure(&path, reason);
        let len = usize::try_from(len).map_err(|_| fail(format!("{len} bytes")))?;
        if len < min_len || len == 0 {
            return Err(fail(format!("{len} bytes, needed {min_len}")));
        }
        let map = Mapped::new(&f, len, false).map_err(|e| fail(format!("mmap: {e}")))?;
        Ok(PeerArena {
            name: name.to_owned(),
            map,
        })
    }

    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    pub(crate) fn len(&self) -> usize {
        self.map.len
    }

    /// The bytes of `range`, or an error if it is not inside the arena.
    pub(crate) fn region(&self, range: std::ops::Range<usize>) -> Result<&[u8]> {
        self.map.bytes(range)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mapped_payload_reads_the_file_and_reports_its_release() {
        let dir = tempfile::tempdir().unwrap();
        let pool = ShmPool::new(dir.path().to_path_buf());
        let data: Vec<u8> = (0..100_000u32).map(|i| i as u8).collect();
        let f = pool.write([&data[..]].into_iter()).unwrap();
        let (m, mut rx) = map(dir.path(), &f.name, data.len() as u64)
            .unwrap()
            .unwrap();
        assert_eq!(&m[..], &data[..]);
        assert!(rx.try_recv().is_err(), "not released while mapped");
        drop(m);
        assert_eq!(rx.try_recv(), Ok(()));
        assert!(
            map(dir.path(), &f.name, 7).is_err(),
            "length checked against the header"
        );
        pool.release(f, true);
        let empty = pool.write([&b""[..]].into_iter()).unwrap();
        assert!(map(dir.path(), &empty.name, 0).unwrap().is_none());
        pool.release(empty, true);
    }

    #[test]
    fn files_are_reused_after_delivery_and_removed_otherwise() {
        let dir = tempfile::tempdir().unwrap();
        let pool = ShmPool::new(dir.path().to_path_buf());
        let a = pool.write([&b"hello"[..]].into_iter()).unwrap();
        let name = a.name.clone();
        assert_eq!(read(dir.path(), &name, 5, Vec::new()).unwrap(), b"hello");
        assert!(
            read(dir.path(), &name, 6, Vec::new()).is_err(),
            "length checked"
        );
        pool.release(a, true);
        let b = pool.write([&b"world"[..]].into_iter()).unwrap();
        assert_eq!(b.name, name, "same length: reused");
        assert_eq!(read(dir.path(), &name, 5, Vec::new()).unwrap(), b"world");
        pool.release(b, false);
        assert!(!dir.path().join(&name).exists(), "failed: removed");
        let c = pool.write([&b"again"[..]].into_iter()).unwrap();
        pool.release(c, true);
        drop(pool);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn two_pools_of_one_process_never_pick_the_same_name() {
        // A worker holds one endpoint (and pool) per job, in one folder.
        let dir = tempfile::tempdir().unwrap();
        let first = ShmPool::new(dir.path().to_path_buf());
        let second = ShmPool::new(dir.path().to_path_buf());
        let a = first.write([&b"one"[..]].into_iter()).unwrap();
        let b = second.write([&b"two"[..]].into_iter()).unwrap();
        assert_ne!(a.name, b.name);
        first.release(a, true);
        second.release(b, true);
    }

    #[test]
    fn files_of_dead_processes_are_swept() {
        let dir = tempfile::tempdir().unwrap();
        // pid 0 never names a live process in /proc
        let dead = dir.path().join(format!("{SHM_PREFIX}4194305-0"));
        let live = dir
            .path()
            .join(format!("{SHM_PREFIX}{}-99", std::process::id()));
        let other = dir.path().join("unrelated");
        for p in [&dead, &live, &other] {
            std::fs::write(p, b"x").unwrap();
        }
        let _pool = ShmPool::new(dir.path().to_path_buf());
        assert!(!dead.exists());
        assert!(live.exists() && other.exists());
    }

    #[test]
    fn an_arena_is_seen_by_its_peers_and_removed_with_its_owner() {
        let dir = tempfile::tempdir().unwrap();
        let mut arena = ShmArena::create(dir.path(), 10_000).unwrap();
        arena.region_mut(100..104).copy_from_slice(b"abcd");
        let peer = PeerArena::open(dir.path(), arena.name(), 10_000).unwrap();
        assert_eq!(peer.region(100..104).unwrap(), b"abcd");
        // Later writes show through the standing mapping.
        arena.region_mut(9_996..10_000).copy_from_slice(b"wxyz");
        assert_eq!(peer.region(9_996..10_000).unwrap(), b"wxyz");
        assert!(peer.region(9_999..10_001).is_err(), "outside the arena");
        assert!(
            PeerArena::open(dir.path(), arena.name(), 10_001).is_err(),
            "shorter than needed"
        );
        assert!(PeerArena::open(dir.path(), "../etc/passwd", 1).is_err());
        assert!(ShmArena::create(dir.path(), 0).is_err());
        drop(arena);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        // The peer's mapping outlives the file.
        assert_eq!(peer.region(100..104).unwrap(), b"abcd");
    }
}
