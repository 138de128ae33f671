//! The marker for types that may live in memory shared between processes.

/// Plain data that may be placed in a shared-memory segment or a DSM page and read by
/// another process: `#[repr(C)]` or primitive, `Copy`, no pointers, references, file
/// descriptors or other process-local handles (links are indices or offsets), and every bit
/// pattern the peer can write is a valid value (style.md practice 5, after iceoryx2's
/// `ZeroCopySend`).
///
/// # Safety
/// Implement only for types meeting every condition above; a type holding a pointer would
/// let one process dereference another's address space.
pub unsafe trait ShmSafe: Copy + Send + 'static {}

// SAFETY: integers are plain bits: no pointers, every bit pattern is valid.
unsafe impl ShmSafe for u8 {}
// SAFETY: as above.
unsafe impl ShmSafe for u16 {}
// SAFETY: as above.
unsafe impl ShmSafe for u32 {}
// SAFETY: as above.
unsafe impl ShmSafe for u64 {}
// SAFETY: as above.
unsafe impl ShmSafe for i64 {}
// SAFETY: every bit pattern of an f64 is a valid (possibly NaN) value; no pointers.
unsafe impl ShmSafe for f64 {}
// SAFETY: an array of plain-data elements is plain data.
unsafe impl<T: ShmSafe, const N: usize> ShmSafe for [T; N] {}
