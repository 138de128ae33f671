//! Word-granular run-length diffs of a page against its twin.
//!
//! A *twin* is a copy of a page taken when a cluster first writes it; at a flush (a
//! release, a barrier arrival) the *diff* (the words that differ from the twin) goes
//! to the page's home, which applies it to the master copy, and rides on the lock
//! that is handed over, whose next holder applies it to its own copy
//! ([`crate::interval::IntervalDiff`]). Several clusters may diff the same page in
//! the same interval; their diffs touch disjoint words in a data-race-free program.
//!
//! Source: Munin's multiple-writer protocol (Carter, Bennett, Zwaenepoel, SOSP 1991
//! §3), reused by MGS (ISCA 1996 §3) and HLRC (OSDI 1996 §2).
//!
//! # Encoding
//!
//! An encoded diff is a sequence of *runs*, with no header. Each run is a 4-byte
//! little-endian header — bits 0..16 the first word index, bits 16..32 the number of
//! words (at least 1) — followed by that many 8-byte words of new contents. Runs are
//! in increasing word order, do not overlap and are separated by at least one
//! unchanged word (the encoder emits maximal runs). The empty byte string is the
//! empty diff.
//!
//! Size bound: with `W` words per page, `m` changed words in `k` runs, the encoding
//! has `4k + 8m` bytes and `k <= W - m + 1`, so it is at most `8W + 4` bytes (one run
//! covering the whole page, [`MAX_ENCODED`] for a 4096-byte page).
//!
//! Decoding ([`apply`], [`validate`]) treats the diff as untrusted input: every
//! malformed diff is reported as a [`DiffError`], never a panic, and the page is
//! left untouched when the diff is malformed.

use crate::ids::WORD_SIZE;

const HEADER: usize = 4;
const MAX_WORDS: usize = u16::MAX as usize;

/// Largest encoded diff of a [`crate::PAGE_SIZE`]-byte page: one run of every word.
///
/// Source: see the module documentation (size bound).
pub const MAX_ENCODED: usize = crate::ids::PAGE_SIZE + HEADER;

/// Why a diff could not be made or applied.
///
/// Source: issue 4 ("decoding untrusted diffs never panics (returns an error)").
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DiffError {
    /// Page, twin or whole-page buffer lengths differ.
    #[error("length mismatch: {0} bytes vs {1} bytes")]
    LengthMismatch(usize, usize),
    /// The page length is not a multiple of [`WORD_SIZE`] or exceeds 65535 words.
    #[error("page length {0} is not a multiple of 8 bytes up to 65535 words")]
    BadPageLength(usize),
    /// The diff ends inside a run header or inside a run's data.
    #[error("diff truncated at byte {0}")]
    Truncated(usize),
    /// A run has zero words.
    #[error("empty run at byte {0}")]
    EmptyRun(usize),
    /// A run extends past the end of the page.
    #[error("run at byte {0} ends past the page")]
    OutOfBounds(usize),
    /// A run starts before the end of the previous run.
    #[error("run at byte {0} overlaps or precedes the previous run")]
    Unordered(usize),
}

/// Summary of a valid diff, from [`validate`].
///
/// Source: statistics of issue 4 ("diffs and diff bytes").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct DiffSummary {
    /// Number of runs.
    pub runs: usize,
    /// Number of words the diff writes.
    pub words: usize,
}

fn check_page_len(len: usize) -> Result<usize, DiffError> {
    if !len.is_multiple_of(WORD_SIZE) || len / WORD_SIZE > MAX_WORDS {
        return Err(DiffError::BadPageLength(len));
    }
    Ok(len / WORD_SIZE)
}

#[inline]
fn word(b: &[u8], i: usize) -> u64 {
    let s = &b[i * WORD_SIZE..(i + 1) * WORD_SIZE];
    u64::from_ne_bytes([s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7]])
}

/// First word index `>= i` where `twin` and `cur` differ, or `words`.
#[inline]
fn next_changed(twin: &[u8], cur: &[u8], mut i: usize, words: usize) -> usize {
    // Skip equal 64-byte blocks, the eight words of each compared without branches
    // (the compiler vectorizes it; a `memcmp` call per block cost more than the
    // comparison), then single words.
    const BLOCK: usize = 8;
    while i + BLOCK <= words {
        let a = i * WORD_SIZE;
        let t: &[u8; BLOCK * WORD_SIZE] =
            twin[a..a + BLOCK * WORD_SIZE].try_into().expect("a block");
        let c: &[u8; BLOCK * WORD_SIZE] =
            cur[a..a + BLOCK * WORD_SIZE].try_into().expect("a block");
        let differ = (0..BLOCK).fold(0, |acc, k| acc | (word(t, k) ^ word(c, k)));
        if differ != 0 {
            break;
        }
        i += BLOCK;
    }
    while i < words && word(twin, i) == word(cur, i) {
        i += 1;
    }
    i
}

/// First word index `>= i` where `twin` and `cur` agree, or `words`: the end of the run
/// starting at `i`.
#[inline]
fn next_unchanged(twin: &[u8], cur: &[u8], mut i: usize, words: usize) -> usize {
    // Skip 64-byte blocks in which every word changed (a page rewritten whole: EM3D's
    // values, Water's positions) with eight comparisons combined without branches,
    // which the compiler vectorizes; then single words.
    const BLOCK: usize = 8;
    while i + BLOCK <= words {
        let a = i * WORD_SIZE;
        let t: &[u8; BLOCK * WORD_SIZE] =
            twin[a..a + BLOCK * WORD_SIZE].try_into().expect("a block");
        let c: &[u8; BLOCK * WORD_SIZE] =
            cur[a..a + BLOCK * WORD_SIZE].try_into().expect("a block");
        let any_equal = (0..BLOCK).fold(false, |acc, k| acc | (word(t, k) == word(c, k)));
        if any_equal {
            break;
        }
        i += BLOCK;
    }
    while i < words && word(twin, i) != word(cur, i) {
        i += 1;
    }
    i
}

/// Appends the diff of `current` against `twin` to `out` and returns the number of
/// bytes appended (0: no word changed).
///
/// `twin` and `current` must have the same length, a multiple of 8 bytes and at most
/// 65535 words (a 4096-byte page has 512). Word comparison is 8-byte granular; runs
/// are maximal; the result is at most `8W + 4` bytes for `W` words.
///
/// Source: twin/diff creation at release (Munin SOSP 1991 §3; HLRC OSDI 1996 §2).
pub fn encode(twin: &[u8], current: &[u8], out: &mut Vec<u8>) -> Result<usize, DiffError> {
    if twin.len() != current.len() {
        return Err(DiffError::LengthMismatch(twin.len(), current.len()));
    }
    let words = check_page_len(twin.len())?;
    let start_len = out.len();
    let mut i = next_changed(twin, current, 0, words);
    while i < words {
        let start = i;
        i = next_unchanged(twin, current, i, words);
        let len = i - start;
        let header = (start as u32) | ((len as u32) << 16);
        out.extend_from_slice(&header.to_le_bytes());
        crate::copy::extend_bytes(out, &current[start * WORD_SIZE..i * WORD_SIZE]);
        i = next_changed(twin, current, i, words);
    }
    Ok(out.len() - start_len)
}

/// Bytes of a *line*: the grain of the runtime's write marks, one cache line (x86-64
/// and most AArch64 cores), 8 words. [`encode_lines`] diffs whole lines.
pub const LINE_SIZE: usize = 64;

/// The lines a mask names, in increasing order: bit `k` of `lines` set names line `k`
/// (bytes `64k .. 64k + 64` of a page). The one walk over a mask of lines that
/// [`encode_lines`], the runtime's view reads and its write marks share.
pub fn line_indices(lines: u64) -> impl Iterator<Item = usize> {
    let mut rest = lines;
    std::iter::from_fn(move || {
        (rest != 0).then(|| {
            let line = rest.trailing_zeros() as usize;
            rest &= rest - 1;
            line
        })
    })
}

/// Appends to `out` the diff of `current` against `twin` over the [`LINE_SIZE`]-byte
/// lines that `lines` names (bit `k`: bytes `64k .. 64k + 64`), then copies those lines
/// of `current` into `twin`, so that the twin holds exactly what was diffed. Returns
/// the number of bytes appended (0: no word of those lines changed).
///
/// The result is what [`encode`] gives for pages that differ only inside the named
/// lines: maximal runs in increasing order, a run of changed words that reaches the
/// end of a line continuing into the next line when that one is named too. Lines not
/// named are neither read nor compared; only they may hold bytes of `current` that
/// are stale (a caller reading the page line by line fills only the named lines).
///
/// `twin` and `current` must have the same length, a multiple of [`LINE_SIZE`] of at
/// most 64 lines (a 4096-byte page has 64), and `lines` must name lines inside it.
///
/// # Errors
/// [`DiffError::LengthMismatch`] or [`DiffError::BadPageLength`] for lengths outside
/// that, or a `lines` naming a line past the end; nothing is appended or copied then.
///
/// Source: twin/diff creation at release (Munin SOSP 1991 §3; HLRC OSDI 1996 §2),
/// restricted to the lines a software write detection marked (Midway's software dirty
/// bits: Zekauskas, Sawdon and Bershad, OSDI 1994).
pub fn encode_lines(
    twin: &mut [u8],
    current: &[u8],
    lines: u64,
    out: &mut Vec<u8>,
) -> Result<usize, DiffError> {
    const LINE_WORDS: usize = LINE_SIZE / WORD_SIZE;
    if twin.len() != current.len() {
        return Err(DiffError::LengthMismatch(twin.len(), current.len()));
    }
    let len = twin.len();
    let page_lines = len / LINE_SIZE;
    if !len.is_multiple_of(LINE_SIZE)
        || page_lines > 64
        || (page_lines < 64 && lines >> page_lines != 0)
    {
        return Err(DiffError::BadPageLength(len));
    }
    let start_len = out.len();
    // The open run: where its header sits in `out`, its first word, and the word after
    // its last.
    let mut open: Option<(usize, usize)> = None;
    let mut end = 0usize;
    let close = |out: &mut Vec<u8>, open: Option<(usize, usize)>, end: usize| {
        if let Some((at, start)) = open {
            let header = (start as u32) | (((end - start) as u32) << 16);
            out[at..at + HEADER].copy_from_slice(&header.to_le_bytes());
        }
    };
    for line in line_indices(lines) {
        let first = line * LINE_WORDS;
        for w in first..first + LINE_WORDS {
            if word(twin, w) == word(current, w) {
                continue;
            }
            if open.is_none() || end != w {
                close(out, open, end);
                open = Some((out.len(), w));
                out.extend_from_slice(&[0; HEADER]);
            }
            out.extend_from_slice(&current[w * WORD_SIZE..(w + 1) * WORD_SIZE]);
            end = w + 1;
        }
        let bytes = line * LINE_SIZE..(line + 1) * LINE_SIZE;
        twin[bytes.clone()].copy_from_slice(&current[bytes]);
    }
    close(out, open, end);
    Ok(out.len() - start_len)
}

/// The diff of `current` against `twin` as a new vector (see [`encode`]).
///
/// Source: see [`encode`].
pub fn create(twin: &[u8], current: &[u8]) -> Result<Vec<u8>, DiffError> {
    let mut out = Vec::new();
    encode(twin, current, &mut out)?;
    Ok(out)
}

/// Checks that `diff` is a well-formed encoding for a page of `page_len` bytes.
///
/// Source: issue 4 (untrusted diffs are decoded without panicking).
pub fn validate(diff: &[u8], page_len: usize) -> Result<DiffSummary, DiffError> {
    let words = check_page_len(page_len)?;
    let mut s = DiffSummary::default();
    let mut pos = 0usize;
    let mut end_prev = 0usize;
    while pos < diff.len() {
        if diff.len() - pos < HEADER {
            return Err(DiffError::Truncated(pos));
        }
        let h = u32::from_le_bytes([diff[pos], diff[pos + 1], diff[pos + 2], diff[pos + 3]]);
        let start = (h & 0xffff) as usize;
        let len = (h >> 16) as usize;
        if len == 0 {
            return Err(DiffError::EmptyRun(pos));
        }
        if start < end_prev || (s.runs > 0 && start == end_prev) {
            return Err(DiffError::Unordered(pos));
        }
        if start + len > words {
            return Err(DiffError::OutOfBounds(pos));
        }
        if diff.len() - pos - HEADER < len * WORD_SIZE {
            return Err(DiffError::Truncated(pos));
        }
        pos += HEADER + len * WORD_SIZE;
        end_prev = start + len;
        s.runs += 1;
        s.words += len;
    }
    Ok(s)
}

/// Applies an encoded diff to `page` (the home's master copy). The diff is validated
/// completely before any byte of `page` changes.
///
/// Source: the home applies diffs to its master copy (HLRC OSDI 1996 §2).
pub fn apply(page: &mut [u8], diff: &[u8]) -> Result<DiffSummary, DiffError> {
    let s = validate(diff, page.len())?;
    let mut pos = 0usize;
    while pos < diff.len() {
        let h = u32::from_le_bytes([diff[pos], diff[pos + 1], diff[pos + 2], diff[pos + 3]]);
        let start = (h & 0xffff) as usize * WORD_SIZE;
        let bytes = (h >> 16) as usize * WORD_SIZE;
        pos += HEADER;
        crate::copy::copy_bytes(&mut page[start..start + bytes], &diff[pos..pos + bytes]);
        pos += bytes;
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::PAGE_SIZE;

    fn page_with(words: &[(usize, u64)]) -> Vec<u8> {
        let mut p = vec![0u8; PAGE_SIZE];
        for &(i, v) in words {
            p[i * 8..i * 8 + 8].copy_from_slice(&v.to_ne_bytes());
        }
        p
    }

    #[test]
    fn unchanged_page_gives_empty_diff() {
        let t = page_with(&[(3, 9)]);
        assert_eq!(create(&t, &t).unwrap(), Vec::<u8>::new());
    }

    #[test]
    fn alternating_words_fit_in_a_page() {
        let twin = vec![0u8; PAGE_SIZE];
        let cur = page_with(&(0..512).step_by(2).map(|i| (i, 1)).collect::<Vec<_>>());
        let d = create(&twin, &cur).unwrap();
        assert_eq!(d.len(), 256 * 12);
        let mut p = twin.clone();
        assert_eq!(
            apply(&mut p, &d).unwrap(),
            DiffSummary {
                runs: 256,
                words: 256
            }
        );
        assert_eq!(p, cur);
    }

    #[test]
    fn every_word_changed_is_one_run() {
        let twin = vec![0u8; PAGE_SIZE];
        let cur = vec![1u8; PAGE_SIZE];
        let d = create(&twin, &cur).unwrap();
        assert_eq!(d.len(), MAX_ENCODED);
        let mut p = twin.clone();
        apply(&mut p, &d).unwrap();
        assert_eq!(p, cur);
        // appending keeps what the buffer held
        let mut out = vec![9u8];
        assert_eq!(encode(&twin, &cur, &mut out).unwrap(), MAX_ENCODED);
        assert_eq!(out[0], 9);
    }

    proptest::proptest! {
        /// Any pattern of changed words (runs of every length, across and inside
        /// 8-word blocks) encodes to maximal runs in order that rebuild the page.
        #[test]
        fn diffs_are_maximal_runs_that_rebuild_the_page(
            changed in proptest::collection::vec(proptest::bool::weighted(0.7), 512),
            seed in proptest::prelude::any::<u64>(),
        ) {
            let twin: Vec<u8> = (0..PAGE_SIZE).map(|b| (b as u64 ^ seed) as u8).collect();
            let mut cur = twin.clone();
            for (i, &c) in changed.iter().enumerate() {
                if c {
                    cur[i * 8] ^= 0x5a;
                }
            }
            let d = create(&twin, &cur).unwrap();
            let mut p = twin.clone();
            let s = apply(&mut p, &d).unwrap();
            proptest::prop_assert_eq!(&p, &cur);
            let words = changed.iter().filter(|&&c| c).count();
            let runs = (0..512).filter(|&i| changed[i] && (i == 0 || !changed[i - 1])).count();
            proptest::prop_assert_eq!(s, DiffSummary { runs, words });
            proptest::prop_assert_eq!(d.len(), 4 * runs + 8 * words);
        }
    }

    proptest::proptest! {
        /// Diffing only the lines that changed gives exactly the whole page's diff
        /// (runs joined across neighbouring lines), and leaves the twin equal to the
        /// page; lines named but unchanged add nothing.
        #[test]
        fn a_diff_of_the_changed_lines_is_the_whole_pages_diff(
            changed in proptest::collection::vec(proptest::bool::weighted(0.2), 512),
            extra in proptest::prelude::any::<u64>(),
            seed in proptest::prelude::any::<u64>(),
        ) {
            let twin: Vec<u8> = (0..PAGE_SIZE).map(|b| (b as u64 ^ seed) as u8).collect();
            let mut cur = twin.clone();
            let mut lines = 0u64;
            for (i, &c) in changed.iter().enumerate() {
                if c {
                    cur[i * 8 + 3] ^= 0xa5;
                    lines |= 1 << (i / 8);
                }
            }
            let whole = create(&twin, &cur).unwrap();
            let mut t = twin.clone();
            let mut out = vec![7u8];
            let n = encode_lines(&mut t, &cur, lines | extra, &mut out).unwrap();
            proptest::prop_assert_eq!(n, whole.len());
            proptest::prop_assert_eq!(&out[1..], &whole[..]);
            proptest::prop_assert_eq!(&t, &cur);
        }
    }

    #[test]
    fn lines_not_named_are_neither_diffed_nor_copied() {
        let twin = vec![0u8; PAGE_SIZE];
        // Words 7 and 8 (the end of line 0, the start of line 1) and word 20 (line 2).
        let cur = page_with(&[(7, 1), (8, 2), (20, 3)]);
        let mut t = twin.clone();
        let mut out = Vec::new();
        encode_lines(&mut t, &cur, 0b001, &mut out).unwrap();
        assert_eq!(out, create(&twin, &page_with(&[(7, 1)])).unwrap());
        assert_eq!(t, page_with(&[(7, 1)]), "only line 0 copied into the twin");
        // Lines 0 and 1 named: one run across the boundary; line 2 left alone.
        let mut t = twin.clone();
        out.clear();
        encode_lines(&mut t, &cur, 0b011, &mut out).unwrap();
        assert_eq!(out, create(&twin, &page_with(&[(7, 1), (8, 2)])).unwrap());
        assert_eq!(validate(&out, PAGE_SIZE).unwrap().runs, 1);
        // Nothing changed in the lines named: nothing appended.
        let mut t = twin.clone();
        out.clear();
        assert_eq!(encode_lines(&mut t, &cur, 1 << 40, &mut out), Ok(0));
        assert!(out.is_empty());
    }

    #[test]
    fn line_diffs_check_their_lengths() {
        let mut t = vec![0u8; 128];
        let mut out = Vec::new();
        assert_eq!(
            encode_lines(&mut t, &[0; 64], 1, &mut out),
            Err(DiffError::LengthMismatch(128, 64))
        );
        assert_eq!(
            encode_lines(&mut t, &[0; 128], 0b100, &mut out),
            Err(DiffError::BadPageLength(128)),
            "a line past the end"
        );
        let mut odd = vec![0u8; 72];
        assert_eq!(
            encode_lines(&mut odd, &[0; 72], 1, &mut out),
            Err(DiffError::BadPageLength(72))
        );
        assert!(out.is_empty());
    }

    #[test]
    fn malformed_diffs_are_errors_and_leave_page_alone() {
        let mut p = vec![5u8; 64];
        let orig = p.clone();
        // truncated header
        assert_eq!(apply(&mut p, &[1, 0]), Err(DiffError::Truncated(0)));
        // zero-length run
        assert_eq!(apply(&mut p, &[0, 0, 0, 0]), Err(DiffError::EmptyRun(0)));
        // run past the 8-word page
        let h = (7u32 | (2 << 16)).to_le_bytes();
        let mut d = h.to_vec();
        d.extend_from_slice(&[0; 16]);
        assert_eq!(apply(&mut p, &d), Err(DiffError::OutOfBounds(0)));
        // valid first run, then an overlapping second one
        let mut d = (2u32 << 16).to_le_bytes().to_vec();
        d.extend_from_slice(&[1; 16]);
        d.extend_from_slice(&(1u32 | (1 << 16)).to_le_bytes());
        d.extend_from_slice(&[2; 8]);
        assert_eq!(apply(&mut p, &d), Err(DiffError::Unordered(20)));
        // truncated data
        let mut d = (2u32 << 16).to_le_bytes().to_vec();
        d.extend_from_slice(&[1; 9]);
        assert_eq!(apply(&mut p, &d), Err(DiffError::Truncated(0)));
        assert_eq!(p, orig);
    }

    #[test]
    fn bad_lengths_are_errors() {
        assert_eq!(
            create(&[0; 8], &[0; 16]),
            Err(DiffError::LengthMismatch(8, 16))
        );
        assert_eq!(create(&[0; 9], &[0; 9]), Err(DiffError::BadPageLength(9)));
    }
}
