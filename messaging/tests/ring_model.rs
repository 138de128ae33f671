//! Model-based property test: any sequence of pushes and pops on a ring behaves like a
//! bounded `VecDeque`: FIFO, full hands the value back, empty answers `None`.

use multigrain_messaging::HeapRing;
use proptest::prelude::*;
use std::collections::VecDeque;

proptest! {
    #[test]
    fn ring_matches_a_bounded_fifo(cap_log in 1u32..6, ops in proptest::collection::vec(any::<Option<u32>>(), 0..500)) {
        let cap = 1usize << cap_log;
        let ring = HeapRing::<u32>::new(cap);
        let mut model = VecDeque::new();
        for op in ops {
            match op {
                Some(v) => {
                    let r = ring.push(v);
                    if model.len() < cap {
                        prop_assert_eq!(r, Ok(()));
                        model.push_back(v);
                    } else {
                        prop_assert_eq!(r, Err(v));
                    }
                }
                None => prop_assert_eq!(ring.pop(), model.pop_front()),
            }
            prop_assert_eq!(ring.len(), model.len());
        }
    }
}
