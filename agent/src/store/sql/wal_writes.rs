//! A SQLite VFS over the system's own (`unix`) that writes the frames a transaction appends to the WAL with one
//! system call at its commit, instead of two for each frame.
//!
//! SQLite appends a frame to the WAL in two writes, its 24-byte header and then its page, so a commit of n pages is
//! 2n `pwrite`s; and since a frame (4,120 bytes) straddles the file's 4 KiB pages, the kernel prepares and copies
//! into three of them for each frame. In a profile of the AG-UI round trip at concurrency 32 on the durable store,
//! writing the WAL's frames was an eighth of the server's CPU. Here the frames a transaction appends are held in
//! memory, in the order written, and written at once when the frame that marks the commit is complete: one `pwrite`
//! a commit (one for each 124 KiB of a large one), and each page of the file prepared once.
//!
//! Why nobody can tell the difference:
//! - Another connection reads only frames a commit published (the WAL index's header), and SQLite publishes a
//!   commit after its frames are written: the held frames are written within the write of the commit frame's page,
//!   before that write returns. A failure to write them fails that write, so the commit fails as it would have.
//! - This connection reads its own WAL through this file, and every other use of the file (a read, its size, a
//!   sync, a truncation, a file control, its close) first writes what is held.
//! - A write that does not continue the frames being appended (a page rewritten in place within a transaction, the
//!   checksums SQLite rewrites after such a commit) goes straight to the file, after what is held.
//! - Frames held without a commit belong to a transaction that spilled pages and then rolled back. They are written
//!   before the connection lets go of the WAL's write lock (which it does through the database's main file, so
//!   that file is wrapped too, to see it), as SQLite would have written them, so no bytes of this connection reach
//!   the file once another writer may append there.
//! - Frames held when the process dies belong to a transaction that did not commit: SQLite's recovery drops such
//!   frames anyway.
//!
//! Only WAL files and the main files of their databases are wrapped; every other file the VFS opens is the `unix`
//! VFS's own. No crate offers this (the VFS crates on crates.io implement whole file systems), and the part that
//! decides what to hold ([`Frames`]) is plain Rust, tested on its own.

use std::ffi::{CStr, c_char, c_int, c_void};
use std::ptr;
use std::sync::{Mutex, PoisonError};

use rusqlite::ffi;

/// The VFS's name, for `sqlite3_open_v2`.
const NAME: &CStr = c"toolgate-wal";

/// A WAL frame's header: its page number, the database's size in pages if it commits (else 0), salts, checksums.
const FRAME_HEADER: usize = 24;
/// The WAL file's own header, written at offset 0 when the WAL starts (over).
const WAL_HEADER: usize = 32;
/// Held frames past this many bytes are written before the transaction commits (a large transaction).
const HOLD_AT_MOST: usize = 1 << 20;
/// The most one write to the `unix` VFS's file carries: under its limit of 128 KiB, in whole pages of memory.
const WRITE_AT_MOST: usize = 124 << 10;
/// The room held frames get at first, and keep between transactions; more is given back after their write.
const KEEP: usize = 256 << 10;

/// Where held bytes go: the file under the VFS (a recording in tests). Returns SQLite's result code.
trait Sink {
    fn write(&mut self, bytes: &[u8], offset: i64) -> c_int;
}

/// What a WAL file holds back: the frames a transaction is appending, not yet written.
#[derive(Debug, Default)]
struct Frames {
    /// The held bytes, from `start` in the file.
    held: Vec<u8>,
    start: i64,
    /// Where the next appended frame goes, once known: after the last frame appended.
    next: Option<i64>,
    /// The frame header held last marks a commit: the write of its page completes the commit.
    commit: bool,
    /// The offset of the last write that went straight to the file, if it was a frame header.
    header_written_at: Option<i64>,
}

impl Frames {
    /// Writes `bytes` at `offset`, or holds them.
    fn write(&mut self, sink: &mut impl Sink, bytes: &[u8], offset: i64) -> c_int {
        if !self.held.is_empty() {
            if offset == self.end() {
                self.held.extend_from_slice(bytes);
                if bytes.len() == FRAME_HEADER {
                    self.commit = marks_commit(bytes);
                    return ffi::SQLITE_OK;
                }
                if self.commit || self.held.len() >= HOLD_AT_MOST {
                    return self.flush(sink);
                }
                return ffi::SQLITE_OK;
            }
            let flushed = self.flush(sink);
            if flushed != ffi::SQLITE_OK {
                return flushed;
            }
        }
        let appends = (bytes.len() == WAL_HEADER && offset == 0)
            || (bytes.len() == FRAME_HEADER && self.next == Some(offset));
        if appends {
            self.start = offset;
            // Room for a usual group of commits at once, not grown frame by frame.
            self.held.reserve(KEEP);
            self.held.extend_from_slice(bytes);
            self.commit = bytes.len() == FRAME_HEADER && marks_commit(bytes);
            self.header_written_at = None;
            return ffi::SQLITE_OK;
        }
        let written = sink.write(bytes, offset);
        if written != ffi::SQLITE_OK {
            self.next = None;
            self.header_written_at = None;
            return written;
        }
        // A page written right after a frame header written straight before it is a frame appended: the next goes
        // after it. (Until this file first sees the WAL start, or such a frame, it does not know where appends go.)
        let end = offset + bytes.len() as i64;
        if bytes.len() == FRAME_HEADER {
            self.header_written_at = Some(offset);
        } else {
            if self.header_written_at == Some(offset - FRAME_HEADER as i64) {
                self.next = Some(end);
            } else if self.next.is_some_and(|next| end > next) {
                self.next = None;
            }
            self.header_written_at = None;
        }
        ffi::SQLITE_OK
    }

    /// Writes what is held.
    fn flush(&mut self, sink: &mut impl Sink) -> c_int {
        if self.held.is_empty() {
            return ffi::SQLITE_OK;
        }
        let written = sink.write(&self.held, self.start);
        self.next = (written == ffi::SQLITE_OK).then(|| self.end());
        self.held.clear();
        self.held.shrink_to(KEEP);
        self.commit = false;
        written
    }

    /// The file is cut at `size`: appends past it are no longer known to go there.
    fn truncated(&mut self, size: i64) {
        if self.next.is_some_and(|next| next > size) {
            self.next = None;
        }
        self.header_written_at = None;
    }

    fn end(&self) -> i64 {
        self.start + self.held.len() as i64
    }
}

/// Whether a frame header marks its frame as a transaction's commit (a database size, not 0).
fn marks_commit(header: &[u8]) -> bool {
    header[4..8] != [0; 4]
}

/// Registers the VFS once, beside (not instead of) the default one (a failure is tried again at the next call). Its
/// name, or SQLite's error code.
pub(super) fn register() -> Result<&'static CStr, c_int> {
    static REGISTERED: Mutex<bool> = Mutex::new(false);
    let mut registered = REGISTERED.lock().unwrap_or_else(PoisonError::into_inner);
    if *registered {
        return Ok(NAME);
    }
    // SAFETY: `sqlite3_vfs_find` initializes SQLite if needed and returns the default VFS, which lives as long as
    // the process; the VFS made here is leaked, so it does too, as `sqlite3_vfs_register` requires.
    let outcome = {
        unsafe {
            let real = ffi::sqlite3_vfs_find(ptr::null());
            let Some(real_vfs) = real.as_ref() else {
                return Err(ffi::SQLITE_ERROR);
            };
            let vfs = Box::leak(Box::new(ffi::sqlite3_vfs {
                iVersion: real_vfs.iVersion.min(3),
                szOsFile: REAL_AT as c_int + real_vfs.szOsFile,
                mxPathname: real_vfs.mxPathname,
                pNext: ptr::null_mut(),
                zName: NAME.as_ptr(),
                pAppData: real.cast(),
                xOpen: Some(open),
                xDelete: Some(delete),
                xAccess: Some(access),
                xFullPathname: Some(full_pathname),
                xDlOpen: Some(dl_open),
                xDlError: Some(dl_error),
                xDlSym: Some(dl_sym),
                xDlClose: Some(dl_close),
                xRandomness: Some(randomness),
                xSleep: Some(sleep),
                xCurrentTime: Some(current_time),
                xGetLastError: Some(get_last_error),
                xCurrentTimeInt64: Some(current_time_int64),
                xSetSystemCall: Some(set_system_call),
                xGetSystemCall: Some(get_system_call),
                xNextSystemCall: Some(next_system_call),
            }));
            ffi::sqlite3_vfs_register(vfs, 0)
        }
    };
    if outcome != ffi::SQLITE_OK {
        return Err(outcome);
    }
    *registered = true;
    Ok(NAME)
}

/// A file this VFS wraps: SQLite's handle, what the file is to its connection, then the `unix` VFS's file.
#[repr(C)]
struct File {
    base: ffi::sqlite3_file,
    role: Role,
}

/// What a wrapped file is to its connection.
enum Role {
    /// A database's main file, and the WAL its connection has open, if any.
    Main { wal: *mut File },
    /// A WAL file: the frames it holds, and its database's main file, if this VFS opened it.
    Wal { frames: Frames, main: *mut File },
}

/// Where the `unix` VFS's file begins within the memory SQLite gives a file of this VFS.
const REAL_AT: usize = std::mem::size_of::<File>().next_multiple_of(16);

/// The WAL's write lock, the first of the locks in its index (`WAL_WRITE_LOCK` in SQLite's `wal.c`).
const WAL_WRITE_LOCK: c_int = 0;

/// The `unix` VFS's file inside `file`.
///
/// # Safety
/// `file` points to `szOsFile` bytes SQLite allocated for a file of this VFS.
unsafe fn real_file(file: *mut ffi::sqlite3_file) -> *mut ffi::sqlite3_file {
    unsafe { file.cast::<u8>().add(REAL_AT).cast() }
}

/// The `unix` VFS.
///
/// # Safety
/// `vfs` is this VFS, as registered.
unsafe fn real_vfs(vfs: *mut ffi::sqlite3_vfs) -> *mut ffi::sqlite3_vfs {
    unsafe { (*vfs).pAppData.cast() }
}

/// The `unix` file's methods.
///
/// # Safety
/// `file` is an open wrapped file of this VFS.
unsafe fn real_methods(file: *mut ffi::sqlite3_file) -> &'static ffi::sqlite3_io_methods {
    unsafe { &*(*real_file(file)).pMethods }
}

/// The file under a WAL file, as a [`Sink`].
struct Real(*mut ffi::sqlite3_file);

impl Sink for Real {
    fn write(&mut self, bytes: &[u8], offset: i64) -> c_int {
        // SAFETY: `self.0` is the open `unix` file under a WAL file of this VFS.
        let Some(write) =
            (unsafe { (*self.0).pMethods.as_ref() }).and_then(|methods| methods.xWrite)
        else {
            return ffi::SQLITE_IOERR_WRITE;
        };
        // The `unix` VFS writes at most 128 KiB less a byte in one call (it masks a larger amount), so what is held
        // goes in pieces under that.
        let mut at = offset;
        for piece in bytes.chunks(WRITE_AT_MOST) {
            // SAFETY: as above; the piece is valid for its length, which fits a `c_int`.
            let written = unsafe { write(self.0, piece.as_ptr().cast(), piece.len() as c_int, at) };
            if written != ffi::SQLITE_OK {
                return written;
            }
            at += piece.len() as i64;
        }
        ffi::SQLITE_OK
    }
}

/// Writes what `file` holds, if it is a WAL file.
///
/// # Safety
/// `file` is an open wrapped file of this VFS, used by one thread at a time (SQLite's rule for a connection's
/// files).
unsafe fn flush(file: *mut ffi::sqlite3_file) -> c_int {
    unsafe {
        match &mut (*file.cast::<File>()).role {
            Role::Wal { frames, .. } => frames.flush(&mut Real(real_file(file))),
            Role::Main { .. } => ffi::SQLITE_OK,
        }
    }
}

unsafe extern "C" fn open(
    vfs: *mut ffi::sqlite3_vfs,
    name: ffi::sqlite3_filename,
    file: *mut ffi::sqlite3_file,
    flags: c_int,
    out_flags: *mut c_int,
) -> c_int {
    // SAFETY: SQLite gives this VFS's own pointer and `szOsFile` bytes at `file`; the `unix` VFS's file fits at the
    // start of them (other files) or at `REAL_AT` (wrapped files), which is how `szOsFile` was counted. A WAL's name
    // is one SQLite made for its database's main file, whose handle `sqlite3_database_file_object` gives: open until
    // the WAL's close, and used by the same connection.
    unsafe {
        let real = real_vfs(vfs);
        let Some(real_open) = (*real).xOpen else {
            return ffi::SQLITE_ERROR;
        };
        let wal = flags & ffi::SQLITE_OPEN_WAL != 0;
        if !wal && flags & ffi::SQLITE_OPEN_MAIN_DB == 0 {
            return real_open(real, name, file, flags, out_flags);
        }
        (*file).pMethods = ptr::null();
        let inner = real_file(file);
        (*inner).pMethods = ptr::null();
        let opened = real_open(real, name, inner, flags, out_flags);
        if opened != ffi::SQLITE_OK {
            if let Some(close) = (*inner)
                .pMethods
                .as_ref()
                .and_then(|methods| methods.xClose)
            {
                close(inner);
            }
            return opened;
        }
        let this = file.cast::<File>();
        let role = if wal {
            let main = ffi::sqlite3_database_file_object(name).cast::<File>();
            let main = if !main.is_null() && ptr::eq((*main).base.pMethods, &METHODS) {
                if let Role::Main { wal } = &mut (*main).role {
                    *wal = this;
                }
                main
            } else {
                ptr::null_mut()
            };
            Role::Wal {
                frames: Frames::default(),
                main,
            }
        } else {
            Role::Main {
                wal: ptr::null_mut(),
            }
        };
        ptr::addr_of_mut!((*this).role).write(role);
        (*file).pMethods = &METHODS;
        ffi::SQLITE_OK
    }
}

static METHODS: ffi::sqlite3_io_methods = ffi::sqlite3_io_methods {
    iVersion: 3,
    xClose: Some(close),
    xRead: Some(read),
    xWrite: Some(write),
    xTruncate: Some(truncate),
    xSync: Some(sync),
    xFileSize: Some(file_size),
    xLock: Some(lock),
    xUnlock: Some(unlock),
    xCheckReservedLock: Some(check_reserved_lock),
    xFileControl: Some(file_control),
    xSectorSize: Some(sector_size),
    xDeviceCharacteristics: Some(device_characteristics),
    xShmMap: Some(shm_map),
    xShmLock: Some(shm_lock),
    xShmBarrier: Some(shm_barrier),
    xShmUnmap: Some(shm_unmap),
    xFetch: Some(fetch),
    xUnfetch: Some(unfetch),
};

// The methods of a wrapped file. SAFETY, for each: SQLite calls them with an open wrapped file of this VFS (its
// `pMethods` is `METHODS` only once `open` succeeded), from one thread at a time; the `unix` file under it is open
// until `close`. A method the `unix` file lacks answers as SQLite's own wrappers treat a missing one.

unsafe extern "C" fn close(file: *mut ffi::sqlite3_file) -> c_int {
    unsafe {
        let flushed = flush(file);
        let this = file.cast::<File>();
        // The file it is paired with no longer points here.
        match &(*this).role {
            Role::Wal { main, .. } if !main.is_null() => {
                if let Role::Main { wal } = &mut (**main).role {
                    *wal = ptr::null_mut();
                }
            }
            Role::Main { wal } if !wal.is_null() => {
                if let Role::Wal { main, .. } = &mut (**wal).role {
                    *main = ptr::null_mut();
                }
            }
            _ => {}
        }
        let inner = real_file(file);
        let closed = match real_methods(file).xClose {
            Some(close) => close(inner),
            None => ffi::SQLITE_OK,
        };
        ptr::drop_in_place(ptr::addr_of_mut!((*this).role));
        (*file).pMethods = ptr::null();
        if flushed != ffi::SQLITE_OK {
            flushed
        } else {
            closed
        }
    }
}

/// Methods of a wrapped file that pass to the `unix` file under it (if its methods, of at least the version given,
/// have one; else what SQLite's own wrappers take a missing one for). The `flushing` ones first write what a WAL file
/// holds.
macro_rules! pass_to_file {
    ($(fn $name:ident($($arg:ident: $type:ty),*)
        -> $ret:ty = $method:ident since $version:literal, else $missing:expr;)*
    ) => {$(
        unsafe extern "C" fn $name(file: *mut ffi::sqlite3_file, $($arg: $type),*) -> $ret {
            unsafe {
                let methods = real_methods(file);
                match methods.$method.filter(|_| methods.iVersion >= $version) {
                    Some(method) => method(real_file(file), $($arg),*),
                    None => $missing,
                }
            }
        }
    )*};
    (flushing $(fn $name:ident($($arg:ident: $type:ty),*)
        = $method:ident since $version:literal, else $missing:expr;)*
    ) => {$(
        unsafe extern "C" fn $name(file: *mut ffi::sqlite3_file, $($arg: $type),*) -> c_int {
            unsafe {
                let flushed = flush(file);
                if flushed != ffi::SQLITE_OK {
                    return flushed;
                }
                let methods = real_methods(file);
                match methods.$method.filter(|_| methods.iVersion >= $version) {
                    Some(method) => method(real_file(file), $($arg),*),
                    None => $missing,
                }
            }
        }
    )*};
}

pass_to_file! {
    flushing
    fn read(buffer: *mut c_void, amount: c_int, offset: ffi::sqlite3_int64)
        = xRead since 1, else ffi::SQLITE_IOERR_READ;
    fn sync(flags: c_int) = xSync since 1, else ffi::SQLITE_IOERR_FSYNC;
    fn file_size(size: *mut ffi::sqlite3_int64) = xFileSize since 1, else ffi::SQLITE_IOERR_FSTAT;
    fn file_control(op: c_int, argument: *mut c_void)
        = xFileControl since 1, else ffi::SQLITE_NOTFOUND;
    fn fetch(offset: ffi::sqlite3_int64, amount: c_int, out: *mut *mut c_void)
        = xFetch since 3, else { *out = ptr::null_mut(); ffi::SQLITE_OK };
}

pass_to_file! {
    fn lock(level: c_int) -> c_int = xLock since 1, else ffi::SQLITE_IOERR_LOCK;
    fn unlock(level: c_int) -> c_int = xUnlock since 1, else ffi::SQLITE_IOERR_UNLOCK;
    fn check_reserved_lock(out: *mut c_int) -> c_int
        = xCheckReservedLock since 1, else ffi::SQLITE_IOERR_CHECKRESERVEDLOCK;
    fn sector_size() -> c_int = xSectorSize since 1, else 4096;
    fn device_characteristics() -> c_int = xDeviceCharacteristics since 1, else 0;
    fn shm_map(page: c_int, page_size: c_int, extend: c_int, out: *mut *mut c_void) -> c_int
        = xShmMap since 2, else ffi::SQLITE_IOERR_SHMMAP;
    fn shm_barrier() -> () = xShmBarrier since 2, else ();
    fn shm_unmap(delete: c_int) -> c_int = xShmUnmap since 2, else ffi::SQLITE_OK;
    fn unfetch(offset: ffi::sqlite3_int64, page: *mut c_void) -> c_int
        = xUnfetch since 3, else ffi::SQLITE_OK;
}

unsafe extern "C" fn write(
    file: *mut ffi::sqlite3_file,
    buffer: *const c_void,
    amount: c_int,
    offset: ffi::sqlite3_int64,
) -> c_int {
    unsafe {
        let Ok(length) = usize::try_from(amount) else {
            return ffi::SQLITE_IOERR_WRITE;
        };
        let bytes = std::slice::from_raw_parts(buffer.cast::<u8>(), length);
        let inner = real_file(file);
        match &mut (*file.cast::<File>()).role {
            Role::Wal { frames, .. } => frames.write(&mut Real(inner), bytes, offset),
            Role::Main { .. } => match real_methods(file).xWrite {
                Some(write) => write(inner, buffer, amount, offset),
                None => ffi::SQLITE_IOERR_WRITE,
            },
        }
    }
}

unsafe extern "C" fn truncate(file: *mut ffi::sqlite3_file, size: ffi::sqlite3_int64) -> c_int {
    unsafe {
        let flushed = flush(file);
        if flushed != ffi::SQLITE_OK {
            return flushed;
        }
        if let Role::Wal { frames, .. } = &mut (*file.cast::<File>()).role {
            frames.truncated(size);
        }
        match real_methods(file).xTruncate {
            Some(truncate) => truncate(real_file(file), size),
            None => ffi::SQLITE_IOERR_TRUNCATE,
        }
    }
}

unsafe extern "C" fn shm_lock(
    file: *mut ffi::sqlite3_file,
    offset: c_int,
    n: c_int,
    flags: c_int,
) -> c_int {
    unsafe {
        // A transaction lets go of the WAL's write lock: what its WAL holds (frames it spilled, then rolled back; a
        // commit left nothing held) goes to the file first, while no other writer may append there. Should that
        // write fail, they are dropped all the same (a failed write forgets them): nothing committed needs them.
        if offset == WAL_WRITE_LOCK
            && n == 1
            && flags == ffi::SQLITE_SHM_UNLOCK | ffi::SQLITE_SHM_EXCLUSIVE
            && let Role::Main { wal } = (*file.cast::<File>()).role
            && !wal.is_null()
            && let Role::Wal { frames, .. } = &mut (*wal).role
        {
            let _ = frames.flush(&mut Real(real_file(wal.cast())));
        }
        let methods = real_methods(file);
        match methods.xShmLock.filter(|_| methods.iVersion >= 2) {
            Some(lock) => lock(real_file(file), offset, n, flags),
            None => ffi::SQLITE_IOERR_SHMLOCK,
        }
    }
}

/// The VFS's other methods: the `unix` VFS's, given that VFS (if it has the method, in at least the version given).
/// SAFETY, for each: SQLite calls them with this VFS, whose `pAppData` is the `unix` VFS (`register`), and the
/// arguments that VFS's method expects.
macro_rules! pass_to_vfs {
    ($(fn $name:ident($($arg:ident: $type:ty),*)
        -> $ret:ty = $method:ident since $version:literal, else $missing:expr;)*
    ) => {$(
        unsafe extern "C" fn $name(vfs: *mut ffi::sqlite3_vfs, $($arg: $type),*) -> $ret {
            unsafe {
                let real = real_vfs(vfs);
                match (*real).$method.filter(|_| (*real).iVersion >= $version) {
                    Some(method) => method(real, $($arg),*),
                    None => $missing,
                }
            }
        }
    )*};
}

type DlSymbol = Option<unsafe extern "C" fn(*mut ffi::sqlite3_vfs, *mut c_void, *const c_char)>;

pass_to_vfs! {
    fn delete(name: *const c_char, sync_dir: c_int) -> c_int
        = xDelete since 1, else ffi::SQLITE_IOERR_DELETE;
    fn access(name: *const c_char, flags: c_int, out: *mut c_int) -> c_int
        = xAccess since 1, else ffi::SQLITE_IOERR_ACCESS;
    fn full_pathname(name: *const c_char, size: c_int, out: *mut c_char) -> c_int
        = xFullPathname since 1, else ffi::SQLITE_ERROR;
    fn dl_open(name: *const c_char) -> *mut c_void = xDlOpen since 1, else ptr::null_mut();
    fn dl_error(size: c_int, out: *mut c_char) -> () = xDlError since 1, else ();
    fn dl_sym(handle: *mut c_void, symbol: *const c_char) -> DlSymbol = xDlSym since 1, else None;
    fn dl_close(handle: *mut c_void) -> () = xDlClose since 1, else ();
    fn randomness(size: c_int, out: *mut c_char) -> c_int = xRandomness since 1, else 0;
    fn sleep(microseconds: c_int) -> c_int = xSleep since 1, else 0;
    fn current_time(out: *mut f64) -> c_int = xCurrentTime since 1, else ffi::SQLITE_ERROR;
    fn get_last_error(size: c_int, out: *mut c_char) -> c_int = xGetLastError since 1, else 0;
    fn current_time_int64(out: *mut ffi::sqlite3_int64) -> c_int
        = xCurrentTimeInt64 since 2, else ffi::SQLITE_ERROR;
    fn set_system_call(name: *const c_char, call: ffi::sqlite3_syscall_ptr) -> c_int
        = xSetSystemCall since 3, else ffi::SQLITE_NOTFOUND;
    fn get_system_call(name: *const c_char) -> ffi::sqlite3_syscall_ptr
        = xGetSystemCall since 3, else None;
    fn next_system_call(name: *const c_char) -> *const c_char
        = xNextSystemCall since 3, else ptr::null();
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The writes that reach the file.
    #[derive(Default)]
    struct Recorded(Vec<(i64, usize)>);

    impl Sink for Recorded {
        fn write(&mut self, bytes: &[u8], offset: i64) -> c_int {
            self.0.push((offset, bytes.len()));
            ffi::SQLITE_OK
        }
    }

    const PAGE: usize = 4096;
    const FRAME: i64 = (FRAME_HEADER + PAGE) as i64;

    fn header(commit: bool) -> [u8; FRAME_HEADER] {
        let mut header = [0; FRAME_HEADER];
        header[3] = 7;
        if commit {
            header[7] = 12;
        }
        header
    }

    /// Appends a frame at `offset` as SQLite does: its header, then its page.
    fn frame(frames: &mut Frames, file: &mut Recorded, offset: i64, commit: bool) {
        assert_eq!(frames.write(file, &header(commit), offset), ffi::SQLITE_OK);
        assert_eq!(
            frames.write(file, &[1; PAGE], offset + FRAME_HEADER as i64),
            ffi::SQLITE_OK
        );
    }

    /// A WAL file's frames and the file under it, once the WAL started: its header written at offset 0 (held, as
    /// the start of what the first transaction appends).
    fn started_wal() -> (Frames, Recorded) {
        let (mut frames, mut file) = (Frames::default(), Recorded::default());
        assert_eq!(frames.write(&mut file, &[0; WAL_HEADER], 0), ffi::SQLITE_OK);
        (frames, file)
    }

    #[test]
    fn a_commit_of_a_started_wal_reaches_the_file_in_one_write_when_its_commit_frame_is_complete() {
        let (mut frames, mut file) = started_wal();
        frame(&mut frames, &mut file, 32, false);
        frame(&mut frames, &mut file, 32 + FRAME, false);
        assert!(file.0.is_empty(), "nothing is written before the commit");
        frame(&mut frames, &mut file, 32 + 2 * FRAME, true);
        assert_eq!(file.0, vec![(0, 32 + 3 * FRAME as usize)]);
        // The next transaction's frames follow, held again until its commit.
        frame(&mut frames, &mut file, 32 + 3 * FRAME, false);
        frame(&mut frames, &mut file, 32 + 4 * FRAME, true);
        assert_eq!(file.0[1..], [(32 + 3 * FRAME, 2 * FRAME as usize)]);
    }

    #[test]
    fn frames_are_held_only_once_it_is_known_where_appends_go() {
        // A connection that opens a WAL with frames in it learns where appends go from its first frame.
        let (mut frames, mut file) = (Frames::default(), Recorded::default());
        let at = 32 + 10 * FRAME;
        frame(&mut frames, &mut file, at, false);
        assert_eq!(file.0, vec![(at, FRAME_HEADER), (at + 24, PAGE)]);
        frame(&mut frames, &mut file, at + FRAME, true);
        assert_eq!(file.0[2..], [(at + FRAME, FRAME as usize)]);
    }

    #[test]
    fn checksums_rewritten_after_a_commit_go_straight_to_the_file() {
        let (mut frames, mut file) = started_wal();
        frame(&mut frames, &mut file, 32, false);
        frame(&mut frames, &mut file, 32 + FRAME, true);
        // SQLite rewrites the headers of the transaction's frames from the first it rewrote a page of.
        assert_eq!(frames.write(&mut file, &header(false), 32), ffi::SQLITE_OK);
        assert_eq!(
            frames.write(&mut file, &header(true), 32 + FRAME),
            ffi::SQLITE_OK
        );
        assert_eq!(
            file.0,
            vec![
                (0, 32 + 2 * FRAME as usize),
                (32, FRAME_HEADER),
                (32 + FRAME, FRAME_HEADER)
            ]
        );
        // Appends still go after the commit's frames.
        frame(&mut frames, &mut file, 32 + 2 * FRAME, true);
        assert_eq!(file.0[3..], [(32 + 2 * FRAME, FRAME as usize)]);
    }

    #[test]
    fn a_page_rewritten_in_place_goes_to_the_file_after_the_frames_held_before_it() {
        let (mut frames, mut file) = started_wal();
        frame(&mut frames, &mut file, 32, false);
        frame(&mut frames, &mut file, 32 + FRAME, false);
        assert_eq!(frames.write(&mut file, &[2; PAGE], 32 + 24), ffi::SQLITE_OK);
        assert_eq!(file.0, vec![(0, 32 + 2 * FRAME as usize), (32 + 24, PAGE)]);
        frame(&mut frames, &mut file, 32 + 2 * FRAME, true);
        assert_eq!(file.0[2..], [(32 + 2 * FRAME, FRAME as usize)]);
    }

    #[test]
    fn held_frames_go_at_a_flush_and_a_large_transaction_does_not_wait_for_its_commit() {
        let (mut frames, mut file) = started_wal();
        frame(&mut frames, &mut file, 32, false);
        // A read of the file, say, writes them first.
        assert_eq!(frames.flush(&mut file), ffi::SQLITE_OK);
        assert_eq!(file.0, vec![(0, 32 + FRAME as usize)]);
        let mut at = 32 + FRAME;
        while file.0.len() == 1 {
            frame(&mut frames, &mut file, at, false);
            at += FRAME;
        }
        assert!(file.0[1].1 >= HOLD_AT_MOST && file.0[1].1 < HOLD_AT_MOST + FRAME as usize);
    }

    #[test]
    fn a_failed_write_of_held_frames_fails_the_commit_and_nothing_stays_held() {
        struct Full;
        impl Sink for Full {
            fn write(&mut self, _: &[u8], _: i64) -> c_int {
                ffi::SQLITE_FULL
            }
        }
        let mut frames = Frames::default();
        assert_eq!(frames.write(&mut Full, &[0; WAL_HEADER], 0), ffi::SQLITE_OK);
        assert_eq!(frames.write(&mut Full, &header(true), 32), ffi::SQLITE_OK);
        assert_eq!(frames.write(&mut Full, &[1; PAGE], 56), ffi::SQLITE_FULL);
        assert_eq!(frames.flush(&mut Full), ffi::SQLITE_OK, "nothing held");
        // Where appends go is no longer known: the next frame goes straight to the file.
        assert_eq!(
            frames.write(&mut Full, &header(false), 32 + FRAME),
            ffi::SQLITE_FULL
        );
    }

    /// A connection through this VFS, as the store opens its writer.
    fn writer(path: &std::path::Path) -> rusqlite::Connection {
        let connection = rusqlite::Connection::open_with_flags_and_vfs(
            path,
            rusqlite::OpenFlags::SQLITE_OPEN_READ_WRITE
                | rusqlite::OpenFlags::SQLITE_OPEN_CREATE
                | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
            register().unwrap(),
        )
        .unwrap();
        connection
            .execute_batch(
                "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL; PRAGMA wal_autocheckpoint = 0;
                 CREATE TABLE IF NOT EXISTS rows (id INTEGER PRIMARY KEY, body TEXT NOT NULL);",
            )
            .unwrap();
        connection
    }

    fn count(connection: &rusqlite::Connection) -> i64 {
        connection
            .query_row("SELECT count(*) FROM rows", [], |row| row.get(0))
            .unwrap()
    }

    fn insert(connection: &rusqlite::Connection, rows: usize, size: usize) {
        let tx = connection.unchecked_transaction().unwrap();
        for _ in 0..rows {
            tx.execute("INSERT INTO rows (body) VALUES (?1)", ["x".repeat(size)])
                .unwrap();
        }
        tx.commit().unwrap();
    }

    /// What a process killed now would leave on the disk: the database and its WAL as the kernel holds them, opened
    /// afresh (SQLite recovers the WAL, checking every frame's checksum), with the rows it finds there.
    fn left_on_disk(path: &std::path::Path) -> i64 {
        let copy = tempfile::tempdir().unwrap();
        let copied = copy.path().join("copy.db");
        std::fs::copy(path, &copied).unwrap();
        let wal = path.with_extension("db-wal");
        if wal.exists() {
            std::fs::copy(&wal, copy.path().join("copy.db-wal")).unwrap();
        }
        let connection = rusqlite::Connection::open(&copied).unwrap();
        let check: String = connection
            .query_row("PRAGMA integrity_check", [], |row| row.get(0))
            .unwrap();
        assert_eq!(check, "ok");
        count(&connection)
    }

    #[test]
    fn every_commit_is_in_the_file_when_it_returns_for_other_connections_and_for_a_crash() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.db");
        let writer = writer(&path);
        let reader = rusqlite::Connection::open(&path).unwrap();
        let mut expected = 0;
        // One small row (one page), many (many pages), rows larger than a page (overflow pages).
        for (rows, size) in [(1, 10), (300, 200), (5, 10_000), (1, 10)] {
            insert(&writer, rows, size);
            expected += rows as i64;
            assert_eq!(count(&reader), expected);
            assert_eq!(left_on_disk(&path), expected);
        }
    }

    #[test]
    fn a_transaction_that_spills_and_rewrites_its_pages_commits_or_rolls_back_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.db");
        let writer = writer(&path);
        writer.execute_batch("PRAGMA cache_size = 10;").unwrap();
        insert(&writer, 1, 10);
        // Spilled frames, then rewritten in place (the same rows changed twice), then rolled back.
        let tx = writer.unchecked_transaction().unwrap();
        for _ in 0..2 {
            tx.execute("INSERT INTO rows (body) SELECT body FROM rows", [])
                .unwrap();
        }
        tx.execute("UPDATE rows SET body = 'y' || body", [])
            .unwrap();
        tx.rollback().unwrap();
        assert_eq!(left_on_disk(&path), 1);
        // The same, committed: SQLite rewrites the checksums of the frames after the first rewritten one.
        let tx = writer.unchecked_transaction().unwrap();
        tx.execute("INSERT INTO rows (body) VALUES (?1)", ["z".repeat(3000)])
            .unwrap();
        for _ in 0..9 {
            tx.execute("INSERT INTO rows (body) SELECT body FROM rows", [])
                .unwrap();
        }
        tx.execute("UPDATE rows SET body = 'y' || body", [])
            .unwrap();
        tx.execute("UPDATE rows SET body = 'w' || body WHERE id % 2 = 0", [])
            .unwrap();
        tx.commit().unwrap();
        let reader = rusqlite::Connection::open(&path).unwrap();
        assert_eq!(count(&reader), 1024);
        assert_eq!(left_on_disk(&path), 1024);
    }

    #[test]
    fn spilled_frames_of_a_rollback_reach_the_file_before_another_writer_may_append() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.db");
        let writer = writer(&path);
        writer.execute_batch("PRAGMA cache_size = 10;").unwrap();
        insert(&writer, 1, 10);
        // Another connection (the `sqlite3` shell, say) copies the WAL into the database and empties it, so that the
        // rollback below reads nothing back from the WAL.
        let other = rusqlite::Connection::open(&path).unwrap();
        other
            .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
            .unwrap();
        // A transaction larger than the page cache starts the WAL over, spills frames, then rolls back: it lets go
        // of the write lock.
        let tx = writer.unchecked_transaction().unwrap();
        tx.execute("INSERT INTO rows (body) VALUES (?1)", ["s".repeat(3000)])
            .unwrap();
        for _ in 0..6 {
            tx.execute("INSERT INTO rows (body) SELECT body FROM rows", [])
                .unwrap();
        }
        tx.rollback().unwrap();
        // The other connection commits where those frames were, from the WAL's start.
        insert(&other, 1000, 1000);
        // The first writer reads the other's pages from the WAL, and writes again.
        assert_eq!(count(&writer), 1001);
        insert(&writer, 1, 10);
        assert_eq!(count(&other), 1002);
        assert_eq!(left_on_disk(&path), 1002);
    }

    #[test]
    fn the_wal_started_over_by_another_connections_checkpoint_is_written_from_its_start() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.db");
        let writer = writer(&path);
        let checkpointer = rusqlite::Connection::open(&path).unwrap();
        let mut expected = 0;
        for mode in ["PASSIVE", "RESTART", "TRUNCATE", "RESTART"] {
            insert(&writer, 50, 300);
            expected += 50;
            checkpointer
                .query_row(&format!("PRAGMA wal_checkpoint({mode})"), [], |_| Ok(()))
                .unwrap();
            insert(&writer, 3, 300);
            expected += 3;
            assert_eq!(count(&checkpointer), expected);
            assert_eq!(left_on_disk(&path), expected);
        }
        drop(writer);
        // The last connection's close checkpoints and removes the WAL.
        drop(checkpointer);
        assert_eq!(left_on_disk(&path), expected);
    }
}
