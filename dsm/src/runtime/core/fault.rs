//! Page faults: served on the faulting thread; a fault that cannot be served ends the
//! process.

use super::*;
use crate::runtime::spin::WaitKind;

impl Core {
    /// Serves a fault of the calling thread (see [`Resolver`]).
    fn fault(self: &Arc<Self>, ops: &RegionOps, fault: Fault) -> Result<(), DsmError> {
        let t0 = FastInstant::now();
        let write = fault.access == Access::Write || fault.kind == FaultKind::WriteProtect;
        let page = PageId::new(fault.page.0 as u32).ok_or_else(|| {
            self.internal(format!(
                "fault on {} beyond the protocol's pages",
                fault.page
            ))
        })?;
        bump(
            if write {
                &self.counters.write_faults
            } else {
                &self.counters.read_faults
            },
            1,
        );
        let waited = self.with_thread(|slot, ep| {
            let s = self.slots.get(slot);
            let seq = s.next_seq();
            let token = FaultToken(token(slot, seq));
            let event = if write {
                Event::WriteFault { page, token }
            } else {
                Event::ReadFault { page, token }
            };
            self.handle(ops, ep, event, None)?;
            if s.is_done(seq) {
                return Ok(false);
            }
            let what = if write { "write" } else { "read" };
            self.wait(ops, ep, slot, seq, WaitKind::Fault, &|| {
                format!("serving a {what} fault on page {}", page.get())
            })?;
            Ok(true)
        })?;
        let ns = t0.elapsed().as_nanos() as u64;
        bump(&self.counters.fault_ns, ns);
        if waited {
            bump(&self.counters.remote_faults, 1);
            bump(&self.counters.remote_fault_ns, ns);
        }
        Ok(())
    }
}

/// The fault resolver of a cluster's region: serves each fault on the faulting thread.
pub(crate) struct Resolver {
    pub(crate) core: Arc<Core>,
}

impl FaultResolver for Resolver {
    fn resolve(&self, region: &RegionOps, fault: Fault) {
        if let Err(e) = self.core.fault(region, fault) {
            let _ = self.core.with_thread(|_, ep| {
                self.core.fail_with(ep, &e);
                Ok(())
            });
            fatal_fault(self.core.me, fault.page.0, &e);
        }
    }
}

/// The faulting access cannot continue: report and end the process.
fn fatal_fault(cluster: usize, page: usize, e: &DsmError) -> ! {
    // Another cluster's failure is not this cluster's: exit as every cluster does that
    // stops because of another (so that launchers tell the cause from the consequences).
    let code = if e.blamed_cluster() == cluster {
        FAULT_EXIT_CODE
    } else {
        multigrain_messaging::control::EXIT_PEER_FAILED
    };
    let msg = format!(
        "multigrain-dsm: cluster {cluster}: the page fault on page {page} cannot be served: {e}; \
         exiting with status {code}\n"
    );
    // SAFETY: write(2) of a buffer we own to standard error; async-signal-safe. The
    // standard library's stderr lock is not taken (the interrupted code may hold it).
    unsafe { libc::write(2, msg.as_ptr().cast(), msg.len()) };
    // SAFETY: _exit(2) ends the process at once without running any handler.
    unsafe { libc::_exit(code) }
}
