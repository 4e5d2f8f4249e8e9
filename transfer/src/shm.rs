//! The same-host path's files: the sender writes a payload into a file of
//! the shared-memory folder (a tmpfs: the pages are memory shared through
//! the page cache) and names it in the header; the receiver reads it.
//!
//! Invariants:
//! 1. A file belongs to its sender (`tessel-{pid}-{n}`, `n` from one
//!    counter for every pool of the process, since a worker holds one
//!    endpoint per job) and serves one
//!    transfer at a time; after the receiver's acknowledgement it goes back
//!    to the sender's pool and is overwritten in place by a later payload
//!    of the same length (no page allocation on the hot path).
//! 2. A file whose transfer failed is removed, the pool keeps at most
//!    [`MAX_FREE`] files, and dropping the pool removes them: no file
//!    outlives its process. Files of processes that died without dropping
//!    their pool are removed by the next pool created on the host.
//! 3. A lent payload (header `lent`) is not copied out: the receiver maps
//!    the file read-only ([`ShmMapping`]) and its consumer reads (reduces)
//!    the bytes where the sender wrote them. The sender neither writes nor
//!    shortens the file until the acknowledgement, which the receiver sends
//!    only once the mapping is dropped, so the mapped bytes never change
//!    under a reader and never shrink away from it.

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
    pub fn new(dir: PathBuf) -> ShmPool {
        sweep_dead(&dir);
        ShmPool {
            dir,
            free: Mutex::new(HashMap::new()),
        }
    }

    /// A file holding `data` (invariant 1).
    pub fn write(&self, data: &[u8]) -> std::io::Result<ShmFile> {
        let len = data.len() as u64;
        let reused = self
            .free
            .lock()
            .expect("not poisoned")
            .get_mut(&len)
            .and_then(Vec::pop);
        let f = match reused {
            Some(f) => f,
            None => {
                let name = format!(
                    "{SHM_PREFIX}{}-{}",
                    std::process::id(),
                    NEXT_FILE.fetch_add(1, Ordering::Relaxed)
                );
                let file = std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create_new(true)
                    .open(self.dir.join(&name))?;
                ShmFile { name, file, len }
            }
        };
        if let Err(e) = f.file.write_all_at(data, 0) {
            self.release(f, false);
            return Err(e);
        }
        Ok(f)
    }

    /// Back to the pool after an acknowledged transfer, else removed
    /// (invariant 2).
    pub fn release(&self, f: ShmFile, delivered: bool) {
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

/// Opens the file a validated header names and checks its length against
/// the header's.
fn open_payload(dir: &Path, name: &str, byte_len: u64) -> Result<(File, PathBuf)> {
    check_shm_name(name)?;
    let path = dir.join(name);
    let f = File::open(&path).map_err(|e| failure(&path, e.to_string()))?;
    let len = f
        .metadata()
        .map_err(|e| failure(&path, e.to_string()))?
        .len();
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

/// A lent payload mapped read-only (invariant 3). Dropping it unmaps the
/// file and tells the receiving stream that the sender may have it back.
pub(crate) struct ShmMapping {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
    released: Option<tokio::sync::oneshot::Sender<()>>,
}

// SAFETY: the mapping is read-only and owned by this value alone (no
// interior mutability); any thread may read it or unmap it on drop.
unsafe impl Send for ShmMapping {}
// SAFETY: as above: shared references only read immutable mapped bytes.
unsafe impl Sync for ShmMapping {}

impl std::ops::Deref for ShmMapping {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        // SAFETY: `ptr` is the start of a live `len`-byte read-only mapping
        // (unmapped only in `drop`) of a file that was exactly `len` bytes
        // long when mapped and that the sender leaves unchanged and
        // unshortened until this value is dropped (invariant 3).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for ShmMapping {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are exactly what `mmap` returned and this is
        // the only unmap; no slice of it outlives `self`.
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len);
        }
        if let Some(tx) = self.released.take() {
            let _ = tx.send(());
        }
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
    use std::os::fd::AsRawFd;
    let (f, path) = open_payload(dir, name, byte_len)?;
    let fail = |reason: String| failure(&path, reason);
    if byte_len == 0 {
        return Ok(None);
    }
    let len = usize::try_from(byte_len).map_err(|_| fail(format!("{byte_len} bytes")))?;
    // SAFETY: a fresh read-only shared mapping of an open file descriptor
    // whose length was just checked; the kernel picks the address, and the
    // result is checked against MAP_FAILED before use. Closing the file
    // afterwards keeps the mapping.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED | libc::MAP_POPULATE,
            f.as_raw_fd(),
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        return Err(fail(format!("mmap: {}", std::io::Error::last_os_error())));
    }
    let ptr = std::ptr::NonNull::new(ptr.cast::<u8>()).ok_or_else(|| fail("mmap: null".into()))?;
    let (released, on_release) = tokio::sync::oneshot::channel();
    let mapping = ShmMapping {
        ptr,
        len,
        released: Some(released),
    };
    Ok(Some((mapping, on_release)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mapped_payload_reads_the_file_and_reports_its_release() {
        let dir = tempfile::tempdir().unwrap();
        let pool = ShmPool::new(dir.path().to_path_buf());
        let data: Vec<u8> = (0..100_000u32).map(|i| i as u8).collect();
        let f = pool.write(&data).unwrap();
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
        let empty = pool.write(b"").unwrap();
        assert!(map(dir.path(), &empty.name, 0).unwrap().is_none());
        pool.release(empty, true);
    }

    #[test]
    fn files_are_reused_after_delivery_and_removed_otherwise() {
        let dir = tempfile::tempdir().unwrap();
        let pool = ShmPool::new(dir.path().to_path_buf());
        let a = pool.write(b"hello").unwrap();
        let name = a.name.clone();
        assert_eq!(read(dir.path(), &name, 5, Vec::new()).unwrap(), b"hello");
        assert!(
            read(dir.path(), &name, 6, Vec::new()).is_err(),
            "length checked"
        );
        pool.release(a, true);
        let b = pool.write(b"world").unwrap();
        assert_eq!(b.name, name, "same length: reused");
        assert_eq!(read(dir.path(), &name, 5, Vec::new()).unwrap(), b"world");
        pool.release(b, false);
        assert!(!dir.path().join(&name).exists(), "failed: removed");
        let c = pool.write(b"again").unwrap();
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
        let a = first.write(b"one").unwrap();
        let b = second.write(b"two").unwrap();
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
}
