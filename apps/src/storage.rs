//! Word storage the numeric kernels are generic over.
//!
//! A kernel takes `&impl F64Words` and calls [`F64Words::get`] / [`F64Words::set`] through a
//! shared reference. The sequential references use [`LocalF64s`] (plain `Cell<f64>`s, full
//! speed, not `Sync`); a parallel runtime supplies its own shared storage (the threads
//! backend uses relaxed atomics, the DSM backend raw words in the DSM region). Kernels are
//! monomorphised for each storage, never called through `dyn`.

use std::cell::Cell;

/// A fixed-length array of `f64` words read and written through `&self`.
///
/// Indices are word indices (one word = 8 bytes). An index `>= len()` panics.
/// Implementations for shared memory give no ordering guarantee of their own: a value
/// written by one thread is guaranteed visible to another only after a release→acquire
/// pair of the runtime (lock release then acquire, or a barrier), see [`crate::team::Team`].
pub trait F64Words {
    /// Number of words.
    fn len(&self) -> usize;

    /// Whether the array has no words.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Reads word `i`.
    fn get(&self, i: usize) -> f64;

    /// Writes word `i`.
    fn set(&self, i: usize, value: f64);

    /// Reads `N` consecutive words starting at `start` (one bounds check where the
    /// implementation can do that; the default reads word by word).
    #[inline]
    fn get_array<const N: usize>(&self, start: usize) -> [f64; N] {
        let mut out = [0.0; N];
        for (k, o) in out.iter_mut().enumerate() {
            *o = self.get(start + k);
        }
        out
    }
}

/// A fixed-length array of `u64` words read and written through `&self`.
///
/// Same indexing and visibility rules as [`F64Words`].
pub trait U64Words {
    /// Number of words.
    fn len(&self) -> usize;

    /// Whether the array has no words.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Reads word `i`.
    fn get(&self, i: usize) -> u64;

    /// Writes word `i`.
    fn set(&self, i: usize, value: u64);
}

/// Thread-local `f64` storage for sequential runs: a boxed slice of `Cell<f64>`, so
/// `get`/`set` through `&self` compile to plain loads and stores.
#[derive(Debug, Clone, Default)]
pub struct LocalF64s {
    words: Box<[Cell<f64>]>,
}

impl LocalF64s {
    /// `len` words, all `0.0`.
    #[must_use]
    pub fn zeroed(len: usize) -> Self {
        Self {
            words: (0..len).map(|_| Cell::new(0.0)).collect(),
        }
    }

    /// Storage holding a copy of `values`.
    #[must_use]
    pub fn from_slice(values: &[f64]) -> Self {
        Self {
            words: values.iter().map(|&v| Cell::new(v)).collect(),
        }
    }

    /// Copies the words out.
    #[must_use]
    pub fn to_vec(&self) -> Vec<f64> {
        self.words.iter().map(Cell::get).collect()
    }
}

impl F64Words for LocalF64s {
    #[inline]
    fn len(&self) -> usize {
        self.words.len()
    }

    #[inline]
    fn get(&self, i: usize) -> f64 {
        self.words[i].get()
    }

    #[inline]
    fn set(&self, i: usize, value: f64) {
        self.words[i].set(value);
    }

    #[inline]
    fn get_array<const N: usize>(&self, start: usize) -> [f64; N] {
        let block = &self.words[start..start + N];
        let mut out = [0.0; N];
        for (o, w) in out.iter_mut().zip(block) {
            *o = w.get();
        }
        out
    }
}

/// Thread-local `u64` storage for sequential runs (see [`LocalF64s`]).
#[derive(Debug, Clone, Default)]
pub struct LocalU64s {
    words: Box<[Cell<u64>]>,
}

impl LocalU64s {
    /// `len` words, all `0`.
    #[must_use]
    pub fn zeroed(len: usize) -> Self {
        Self {
            words: (0..len).map(|_| Cell::new(0)).collect(),
        }
    }
}

impl U64Words for LocalU64s {
    #[inline]
    fn len(&self) -> usize {
        self.words.len()
    }

    #[inline]
    fn get(&self, i: usize) -> u64 {
        self.words[i].get()
    }

    #[inline]
    fn set(&self, i: usize, value: u64) {
        self.words[i].set(value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_f64s_round_trip_and_blocks() {
        let a = LocalF64s::zeroed(5);
        assert_eq!(a.len(), 5);
        assert!(!a.is_empty());
        a.set(3, -2.5);
        a.set(4, f64::MIN_POSITIVE);
        assert_eq!(a.get(3), -2.5);
        assert_eq!(a.get_array::<3>(2), [0.0, -2.5, f64::MIN_POSITIVE]);
        assert_eq!(a.to_vec(), vec![0.0, 0.0, 0.0, -2.5, f64::MIN_POSITIVE]);
        let b = LocalF64s::from_slice(&[1.0, 2.0]);
        assert_eq!(b.get(1), 2.0);
    }

    #[test]
    #[should_panic]
    fn local_f64s_out_of_bounds_panics() {
        let a = LocalF64s::zeroed(2);
        let _ = a.get_array::<2>(1);
    }

    #[test]
    fn local_u64s_round_trip() {
        let a = LocalU64s::zeroed(2);
        a.set(1, u64::MAX);
        assert_eq!(a.get(1), u64::MAX);
        assert_eq!(a.get(0), 0);
        assert_eq!(a.len(), 2);
    }
}
