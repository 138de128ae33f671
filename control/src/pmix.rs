//! A minimal PMIx client: put one key, fence, get another rank's value — the key–value
//! exchange a PMIx launcher (Open MPI's `mpirun`, PRRTE, Slurm's `--mpi=pmix`) offers
//! its processes. `libpmix.so.2` is loaded at run time (`libloading`), so the binary
//! needs no PMIx at build time and works without it where no PMIx launcher is used.
//!
//! Only the few calls and types this needs are declared, from PMIx 4.2's
//! `pmix_common.h` / `pmix.h` (the ABI of the v2 library soname, stable since PMIx 2):
//! `pmix_proc_t` = `{ char nspace[256]; uint32_t rank; }`; `pmix_value_t` = `{ uint16_t
//! type; union { … char *string; … } data; }` with the union at offset 8 and no member
//! larger than 32 bytes.
#![allow(unsafe_code)]

use std::ffi::{CStr, CString, c_char, c_int, c_void};

use libloading::Library;

const PMIX_SUCCESS: c_int = 0;
const PMIX_STRING: u16 = 3;
const PMIX_GLOBAL: u8 = 3;

#[repr(C)]
#[derive(Clone, Copy)]
struct PmixProc {
    nspace: [c_char; 256],
    rank: u32,
}

/// `pmix_value_t` with the union padded generously (64 bytes; PMIx's largest member is
/// 32), zeroed, so the library never reads past it.
#[repr(C)]
struct PmixValue {
    kind: u16,
    data: [u64; 8],
}

type Init = unsafe extern "C" fn(*mut PmixProc, *mut c_void, usize) -> c_int;
type Finalize = unsafe extern "C" fn(*const c_void, usize) -> c_int;
type Put = unsafe extern "C" fn(u8, *const c_char, *mut PmixValue) -> c_int;
type Commit = unsafe extern "C" fn() -> c_int;
type Fence = unsafe extern "C" fn(*const PmixProc, usize, *const c_void, usize) -> c_int;
type Get = unsafe extern "C" fn(
    *const PmixProc,
    *const c_char,
    *const c_void,
    usize,
    *mut *mut PmixValue,
) -> c_int;

/// Exchanges `value` under `key` among the processes of this PMIx job and returns
/// rank 0's value (rank 0 passes its own). Initializes PMIx, puts, commits, fences
/// (every rank must call this), gets, and finalizes PMIx again before returning.
///
/// # Errors
///
/// A message naming the step that failed: `libpmix.so.2` missing, or a PMIx call's
/// status.
pub fn exchange_with_rank0(key: &str, value: &str) -> Result<String, String> {
    // SAFETY: loading libpmix runs its initializers, which only set up the library's
    // own state; the library is a system PMIx client, not arbitrary code. It is never
    // unloaded (unloading a library that started threads is unsound).
    let lib: &'static Library = Box::leak(Box::new(
        unsafe { Library::new("libpmix.so.2") }
            .map_err(|e| format!("cannot load libpmix.so.2 (PMIx client library): {e}"))?,
    ));
    // SAFETY: each symbol is looked up with the C signature declared in PMIx's pmix.h
    // (see the module docs).
    let (init, finalize, put, commit, fence, get) = unsafe {
        (
            lib.get::<Init>(b"PMIx_Init\0"),
            lib.get::<Finalize>(b"PMIx_Finalize\0"),
            lib.get::<Put>(b"PMIx_Put\0"),
            lib.get::<Commit>(b"PMIx_Commit\0"),
            lib.get::<Fence>(b"PMIx_Fence\0"),
            lib.get::<Get>(b"PMIx_Get\0"),
        )
    };
    let missing = |e: libloading::Error| format!("libpmix.so.2 lacks a PMIx call: {e}");
    let api = Api {
        put: *put.map_err(missing)?,
        commit: *commit.map_err(missing)?,
        fence: *fence.map_err(missing)?,
        get: *get.map_err(missing)?,
    };
    let (init, finalize) = (*init.map_err(missing)?, *finalize.map_err(missing)?);
    let mut me = PmixProc {
        nspace: [0; 256],
        rank: 0,
    };
    // SAFETY: `me` is a valid, writable pmix_proc_t; no info array is passed.
    check("PMIx_Init", unsafe {
        init(&mut me, std::ptr::null_mut(), 0)
    })?;
    let result = exchange(&api, &me, key, value);
    // SAFETY: PMIx was initialized above; no info array is passed.
    let fin = check("PMIx_Finalize", unsafe { finalize(std::ptr::null(), 0) });
    let value = result?;
    fin?;
    Ok(value)
}

/// The PMIx calls used between `PMIx_Init` and `PMIx_Finalize`.
struct Api {
    put: Put,
    commit: Commit,
    fence: Fence,
    get: Get,
}

fn check(what: &str, status: c_int) -> Result<(), String> {
    if status == PMIX_SUCCESS {
        Ok(())
    } else {
        Err(format!("PMIx {what} failed with status {status}"))
    }
}

/// Put, commit, fence, get rank 0's value: PMIx must be initialized, `me` this process.
fn exchange(api: &Api, me: &PmixProc, key: &str, value: &str) -> Result<String, String> {
    let ckey = CString::new(key).map_err(|_| "key contains NUL".to_owned())?;
    let cvalue = CString::new(value).map_err(|_| "value contains NUL".to_owned())?;
    let mut v = PmixValue {
        kind: PMIX_STRING,
        data: [0; 8],
    };
    v.data[0] = cvalue.as_ptr() as usize as u64;
    // SAFETY: key and value are NUL-terminated strings that outlive the call (PMIx_Put
    // copies the value); `v` is a zeroed pmix_value_t of type string.
    check("PMIx_Put", unsafe {
        (api.put)(PMIX_GLOBAL, ckey.as_ptr(), &mut v)
    })?;
    // SAFETY: no arguments.
    check("PMIx_Commit", unsafe { (api.commit)() })?;
    // SAFETY: a NULL proc array with 0 entries means every process of this job.
    check("PMIx_Fence", unsafe {
        (api.fence)(std::ptr::null(), 0, std::ptr::null(), 0)
    })?;
    let rank0 = PmixProc {
        nspace: me.nspace,
        rank: 0,
    };
    let mut out: *mut PmixValue = std::ptr::null_mut();
    // SAFETY: `rank0` names rank 0 of our namespace; `out` receives a value the library
    // allocates (left to the process: one small string, once).
    check("PMIx_Get", unsafe {
        (api.get)(&rank0, ckey.as_ptr(), std::ptr::null(), 0, &mut out)
    })?;
    if out.is_null() {
        return Err("PMIx_Get returned no value".to_owned());
    }
    // SAFETY: PMIx_Get succeeded, so `out` points to a pmix_value_t.
    let got = unsafe { &*out };
    if got.kind != PMIX_STRING || got.data[0] == 0 {
        return Err(format!("PMIx_Get returned a value of type {}", got.kind));
    }
    // SAFETY: a PMIx string value holds a NUL-terminated string at the union's start.
    let s = unsafe { CStr::from_ptr(got.data[0] as usize as *const c_char) };
    Ok(s.to_string_lossy().into_owned())
}
