//! Typed arrays in the DSM region.
//!
//! A [`SharedArray`] lives at the same address in every cluster (collective allocation,
//! [`crate::Dsm::alloc`]). Its elements are read and written through `&self` with
//! relaxed atomic 8-byte accesses, so any number of threads may use it concurrently
//! without undefined behaviour; a page fault inside such an access is served
//! transparently. Visibility between threads follows the runtime's release consistency:
//! a value written by one thread is guaranteed visible to another only after a lock
//! release → acquire or a barrier between them; racing accesses see each 8-byte word
//! either old or new, and an element wider than one word is not read or written
//! atomically as a whole.
//!
//! Element sizes are multiples of 8 bytes: the coherence protocol merges the writes of
//! several clusters to one page by 8-byte words (diffs against twins), so two clusters
//! writing different halves of one word between synchronizations would lose one half.
//! With whole-word elements, writes to distinct elements never share a word.

use crate::uffd::{ArrayMarks, Region};
use bytemuck::Pod;
use multigrain_coherence::diff::LINE_SIZE;
use std::fmt;
use std::marker::PhantomData;
use std::mem::size_of;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// An array of `T` in the DSM region (see the module documentation).
///
/// Cloning is cheap (the clone names the same memory). The region stays mapped while
/// any array exists, even after [`crate::Dsm::finish`]; accesses after the job finished
/// may only touch pages still valid in this cluster (a fault then needs the other
/// clusters and ends the process with an error).
pub struct SharedArray<T: Pod> {
    addr: usize,
    len: usize,
    region: Arc<Region>,
    /// The write marks of the array's pages, set after every store (software write
    /// detection: a flush reads only the pages marked since the previous one, see
    /// [`WriteMarks`](crate::uffd::WriteMarks)).
    marks: ArrayMarks,
    _t: PhantomData<fn() -> T>,
}

impl<T: Pod> Clone for SharedArray<T> {
    fn clone(&self) -> Self {
        SharedArray {
            addr: self.addr,
            len: self.len,
            region: Arc::clone(&self.region),
            marks: self.marks.clone(),
            _t: PhantomData,
        }
    }
}

impl<T: Pod> fmt::Debug for SharedArray<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedArray")
            .field("addr", &format_args!("{:#x}", self.addr))
            .field("len", &self.len)
            .field("element", &std::any::type_name::<T>())
            .finish()
    }
}

impl<T: Pod> SharedArray<T> {
    /// An array of `len` elements at `addr`, which lies in `region`, is aligned to
    /// `max(align_of::<T>(), 8)` and leaves room for `len` elements; `T`'s size is a
    /// positive multiple of 8 (checked by the allocator).
    pub(crate) fn new(region: Arc<Region>, addr: usize, len: usize) -> Self {
        let layout = region.layout();
        debug_assert!(size_of::<T>() > 0 && size_of::<T>().is_multiple_of(8));
        debug_assert!(addr >= layout.base() && addr + len * size_of::<T>() <= layout.end());
        debug_assert!(addr.is_multiple_of(std::mem::align_of::<T>().max(8)));
        SharedArray {
            addr,
            len,
            marks: region.marks().of_array(addr, len * size_of::<T>()),
            region,
            _t: PhantomData,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the array has no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The address of element 0, the same in every cluster of the job (for messages and
    /// diagnostics; access goes through the methods).
    pub fn addr(&self) -> usize {
        self.addr
    }

    /// Whether every element lies inside one line of the write marks (64 bytes):
    /// arrays start at a page boundary ([`crate::Dsm::alloc`]), so an element whose size
    /// is a power of two of at most a line never crosses one.
    const IN_ONE_LINE: bool = size_of::<T>().is_power_of_two() && size_of::<T>() <= LINE_SIZE;

    #[inline(always)]
    fn elem(&self, i: usize) -> usize {
        if i >= self.len {
            index_out_of_bounds(i, self.len);
        }
        self.addr + i * size_of::<T>()
    }

    #[inline(always)]
    fn word(addr: usize) -> &'static AtomicU64 {
        // SAFETY: callers pass the address of a word inside an element of this array,
        // which lies inside the region mapping (bounds checked by `elem` or the range
        // checks of `read`/`write`); the mapping lives as long as `self.region`, and the
        // returned reference is used only for the duration of the calling method, while
        // `self` is borrowed. The address is 8-aligned: the array base is page-aligned
        // and elements are `size_of::<T>()` bytes apart, a multiple of 8 (checked by
        // the allocator). Region memory is only ever accessed atomically (this type, the
        // runtime view) or by the kernel, so an atomic reference to it is sound; a fault
        // in the access is served by the runtime's SIGBUS resolver and the access
        // re-executes.
        unsafe { &*(addr as *const AtomicU64) }
    }

    #[inline(always)]
    fn load(addr: usize) -> T {
        let mut v = T::zeroed();
        for (k, chunk) in bytemuck::bytes_of_mut(&mut v)
            .chunks_exact_mut(8)
            .enumerate()
        {
            chunk.copy_from_slice(
                &Self::word(addr + 8 * k)
                    .load(Ordering::Relaxed)
                    .to_ne_bytes(),
            );
        }
        v
    }

    #[inline(always)]
    fn store(addr: usize, v: T) {
        for (k, chunk) in bytemuck::bytes_of(&v).chunks_exact(8).enumerate() {
            let x = u64::from_ne_bytes(chunk.try_into().expect("8-byte chunk"));
            Self::word(addr + 8 * k).store(x, Ordering::Relaxed);
        }
    }

    /// Reads element `i`.
    ///
    /// # Panics
    /// If `i >= len()`.
    #[inline]
    pub fn get(&self, i: usize) -> T {
        Self::load(self.elem(i))
    }

    /// Writes element `i` (and marks its line(s) written, after the store).
    ///
    /// # Panics
    /// If `i >= len()`.
    #[inline]
    pub fn set(&self, i: usize, value: T) {
        let addr = self.elem(i);
        Self::store(addr, value);
        if Self::IN_ONE_LINE {
            // SAFETY: `elem` checked `i < len`, so the element's first byte, and with
            // it the whole element (`IN_ONE_LINE`), lies in one of the array's
            // `ceil(len · size / LINE_SIZE)` lines, the range its marks were taken for
            // (`new`).
            unsafe {
                self.marks
                    .mark_line_unchecked(i * size_of::<T>() / LINE_SIZE)
            };
        } else {
            self.marks.mark_bytes(i * size_of::<T>(), size_of::<T>());
        }
    }

    /// Reads `out.len()` elements starting at `start`.
    ///
    /// # Panics
    /// If the range exceeds the array.
    pub fn read(&self, start: usize, out: &mut [T]) {
        assert!(
            start.checked_add(out.len()).is_some_and(|e| e <= self.len),
            "range {start}..{} out of bounds of a shared array of {} elements",
            start.saturating_add(out.len()),
            self.len
        );
        for (k, o) in out.iter_mut().enumerate() {
            *o = Self::load(self.addr + (start + k) * size_of::<T>());
        }
    }

    /// Writes `src` to the elements starting at `start` (and marks their lines written,
    /// after the stores).
    ///
    /// # Panics
    /// If the range exceeds the array.
    pub fn write(&self, start: usize, src: &[T]) {
        assert!(
            start.checked_add(src.len()).is_some_and(|e| e <= self.len),
            "range {start}..{} out of bounds of a shared array of {} elements",
            start.saturating_add(src.len()),
            self.len
        );
        for (k, &v) in src.iter().enumerate() {
            Self::store(self.addr + (start + k) * size_of::<T>(), v);
        }
        if !src.is_empty() {
            self.marks
                .mark_bytes(start * size_of::<T>(), size_of_val(src));
        }
    }

    /// Copies the whole array out.
    pub fn to_vec(&self) -> Vec<T> {
        let mut v = vec![T::zeroed(); self.len];
        self.read(0, &mut v);
        v
    }
}

/// The panic of an element access out of bounds, out of line: with the message's
/// arguments formatted in place, the compiler kept the index on the stack for it at
/// every access.
#[cold]
#[inline(never)]
#[track_caller]
fn index_out_of_bounds(i: usize, len: usize) -> ! {
    panic!("index {i} out of bounds of a shared array of {len} elements")
}
