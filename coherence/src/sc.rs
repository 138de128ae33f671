//! sc: sequential consistency, single writer / multiple readers, write-invalidate,
//! with each page's home as its fixed directory manager (the baseline hlrc is
//! compared against).
//!
//! # Rules
//!
//! The home keeps, per page, the remote readers (copyset) and the remote writer if
//! any; its own copy is the master whenever no remote cluster holds the page
//! writable. The home serves one request per page at a time, in arrival order; the
//! others wait in a FIFO queue.
//!
//! * **Read fault** (`ScRead` to the home, or a local request at the home): if a
//!   remote cluster holds the page writable, the home *recalls* it (`ScRecall`
//!   without invalidation): the writer write-protects its copy and sends it back
//!   (`ScWriteBack`); the home installs it. If the home itself writes the page, it
//!   write-protects its copy. Then the requester gets a read-only copy (`PageData`)
//!   and joins the copyset.
//! * **Write fault**: the home recalls a remote writer (with invalidation) or sends
//!   `ScInvalidate` to every other reader and collects all `ScInvAck`s; then it
//!   grants write access — `ScUpgrade` (no data) if the requester holds a valid
//!   read-only copy, else `PageData{writable}` — and drops its own copy after
//!   copying it into the reply. The requester becomes the single writer.
//! * **Races**: a recall or invalidation can overtake the grant it refers to on an
//!   unordered network; the requester holds it until the grant has been installed
//!   and then applies it (the home does not serve another request for the page until
//!   the acknowledgement comes, so no second writer or stale reader can appear).
//!   Faults that arrive while a request is outstanding wait for it; a write fault
//!   that waited behind a read request is sent as an upgrade once the read copy is
//!   installed.
//!
//! At every moment a page has either one writable copy and no other valid copy, or
//! only read-only copies equal to the last write; the model check in
//! `tests/model.rs` verifies this.
//!
//! Source: Ivy's fixed distributed manager algorithm (Li & Hudak, "Memory Coherence
//! in Shared Virtual Memory Systems", TOCS 1989 §4.1), with the manager at the
//! page's home and ownership transfers routed through it.

use crate::action::{Action, Source};
use crate::error::ProtocolError;
use crate::ids::{ClusterId, PageId, PageRange};
use crate::machine::{Directory, Fetch, Machine, PageAccess, Phase, Txn, Waiter};
use crate::message::Message;

fn one(page: PageId) -> PageRange {
    PageRange {
        start: page,
        count: 1,
    }
}

impl Machine {
    pub(crate) fn sc_fault(
        &mut self,
        page: PageId,
        w: Waiter,
        out: &mut Vec<Action>,
    ) -> Result<(), ProtocolError> {
        match (self.entry(page).access, w.write) {
            (PageAccess::ReadOnly | PageAccess::ReadWrite, false)
            | (PageAccess::ReadWrite, true) => {
                self.stats.spurious_faults += 1;
                out.push(Action::Wake {
                    page,
                    tokens: vec![w.token],
                });
                Ok(())
            }
            _ => match self.homes.get(page) {
                None => self.start_home_lookup(page, vec![w], out),
                Some(_) => self.sc_request(page, w.write, vec![w], out),
            },
        }
    }

    /// Sends this cluster's request for `page` (to the home, or to the local
    /// directory when homed here) and records the waiting faults.
    pub(crate) fn sc_request(
        &mut self,
        page: PageId,
        write: bool,
        waiters: Vec<Waiter>,
        out: &mut Vec<Action>,
    ) -> Result<(), ProtocolError> {
        let Some(home) = self.homes.get(page) else {
            return Err(Self::unexpected("sc request without a home", self.me, page));
        };
        self.fetches
            .insert(page, Fetch::new(waiters, Phase::Sc { write }));
        if home == self.me {
            self.dirs
                .entry(page)
                .or_default()
                .queue
                .push_back((self.me, write));
            self.sc_pump(page, out)
        } else {
            self.stats.remote_fetches += 1;
            let msg = if write {
                Message::ScWrite { page }
            } else {
                Message::ScRead { page }
            };
            self.send(home, msg, out);
            Ok(())
        }
    }

    pub(crate) fn on_sc_request(
        &mut self,
        from: ClusterId,
        page: PageId,
        write: bool,
        msg: Message,
        out: &mut Vec<Action>,
    ) -> Result<(), ProtocolError> {
        if !self.require_home(from, page, &msg)? {
            return Ok(());
        }
        self.dirs
            .entry(page)
            .or_default()
            .queue
            .push_back((from, write));
        self.sc_pump(page, out)
    }

    /// Starts queued requests while the directory entry is idle.
    fn sc_pump(&mut self, page: PageId, out: &mut Vec<Action>) -> Result<(), ProtocolError> {
        loop {
            let d = self.dirs.entry(page).or_default();
            if d.busy.is_some() {
                return Ok(());
            }
            let Some((r, write)) = d.queue.pop_front() else {
                return Ok(());
            };
            self.sc_start(page, r, write, out)?;
        }
    }

    fn sc_start(
        &mut self,
        page: PageId,
        r: ClusterId,
        write: bool,
        out: &mut Vec<Action>,
    ) -> Result<(), ProtocolError> {
        let me = self.me;
        let d = self.dirs.entry(page).or_default();
        if let Some(o) = d.remote_owner {
            if o == r {
                return Err(Self::unexpected("request from the page's writer", r, page));
            }
            d.busy = Some(Txn {
                requester: r,
                write,
                acks: 0,
                writeback_from: Some(o),
            });
            self.stats.sc_recalls += 1;
            self.send(
                o,
                Message::ScRecall {
                    page,
                    invalidate: write,
                },
                out,
            );
            return Ok(());
        }
        if write {
            let targets: Vec<ClusterId> = d.readers.iter().filter(|&c| c != r && c != me).collect();
            if !targets.is_empty() {
                for &c in &targets {
                    d.readers.remove(c);
                }
                d.busy = Some(Txn {
                    requester: r,
                    write,
                    acks: targets.len() as u32,
                    writeback_from: None,
                });
                for c in targets {
                    self.stats.sc_invalidations_sent += 1;
                    self.send(c, Message::ScInvalidate { page }, out);
                }
                return Ok(());
            }
        }
        self.sc_finish(page, r, write, out)
    }

    /// Grants the request once no conflicting copy remains.
    fn sc_finish(
        &mut self,
        page: PageId,
        r: ClusterId,
        write: bool,
        out: &mut Vec<Action>,
    ) -> Result<(), ProtocolError> {
        let me = self.me;
        let home_access = self.entry(page).access;
        let d: &mut Directory = self.dirs.entry(page).or_default();
        d.busy = None;
        if r == me {
            if write {
                d.readers.clear();
            }
            return self.sc_local_grant(page, write, out);
        }
        let zero = home_access == PageAccess::Untouched;
        if home_access == PageAccess::Invalid {
            return Err(Self::unexpected(
                "grant while the home copy is invalid",
                r,
                page,
            ));
        }
        if write {
            let upgrade = d.readers.contains(r);
            d.readers.clear();
            d.remote_owner = Some(r);
            if home_access == PageAccess::ReadWrite {
                out.push(Action::WriteProtect { pages: one(page) });
            }
            self.stats.sc_ownership_grants += 1;
            let msg = if upgrade {
                Message::ScUpgrade { page }
            } else {
                Message::PageData {
                    page,
                    writable: true,
                    zero,
                }
            };
            self.send(r, msg, out);
            if matches!(home_access, PageAccess::ReadOnly | PageAccess::ReadWrite) {
                out.push(Action::Invalidate { pages: one(page) });
                self.stats.invalidations += 1;
            }
            self.entry(page).access = PageAccess::Invalid;
        } else {
            d.readers.insert(r);
            if home_access == PageAccess::ReadWrite {
                out.push(Action::WriteProtect { pages: one(page) });
                self.entry(page).access = PageAccess::ReadOnly;
            }
            if zero {
                self.stats.zero_pages_served += 1;
            } else {
                self.stats.pages_served += 1;
            }
            self.send(
                r,
                Message::PageData {
                    page,
                    writable: false,
                    zero,
                },
                out,
            );
        }
        Ok(())
    }

    /// The home grants its own request.
    fn sc_local_grant(
        &mut self,
        page: PageId,
        write: bool,
        out: &mut Vec<Action>,
    ) -> Result<(), ProtocolError> {
        let access = self.entry(page).access;
        let new = match (access, write) {
            (PageAccess::Untouched, _) => {
                out.push(Action::Install {
                    page,
                    source: Source::Zero,
                    writable: write,
                });
                if write {
                    PageAccess::ReadWrite
                } else {
                    PageAccess::ReadOnly
                }
            }
            (PageAccess::ReadOnly, true) => {
                out.push(Action::Unprotect { page });
                PageAccess::ReadWrite
            }
            (PageAccess::ReadOnly | PageAccess::ReadWrite, _) => access,
            (PageAccess::Invalid, _) => {
                return Err(Self::unexpected(
                    "local grant of an invalid home page",
                    self.me,
                    page,
                ));
            }
        };
        self.entry(page).access = new;
        self.sc_complete_fetch(page, write, out)
    }

    /// A grant arrived (or was made locally): wake the waiters it satisfies, send an
    /// upgrade for write faults that waited behind a read, replay held messages.
    fn sc_complete_fetch(
        &mut self,
        page: PageId,
        write: bool,
        out: &mut Vec<Action>,
    ) -> Result<(), ProtocolError> {
        let Some(mut f) = self.fetches.remove(&page) else {
            return Err(Self::unexpected("grant without a request", self.me, page));
        };
        if f.phase != (Phase::Sc { write }) {
            return Err(Self::unexpected("grant of the wrong kind", self.me, page));
        }
        self.inbox.extend(std::mem::take(&mut f.deferred));
        let (woken, rest): (Vec<Waiter>, Vec<Waiter>) = if write {
            (f.waiters, Vec::new())
        } else {
            f.waiters.into_iter().partition(|w| !w.write)
        };
        if !woken.is_empty() {
            out.push(Action::Wake {
                page,
                tokens: woken.iter().map(|w| w.token).collect(),
            });
        }
        if !rest.is_empty() {
            self.sc_request(page, true, rest, out)?;
        }
        Ok(())
    }

    pub(crate) fn on_page_data_sc(
        &mut self,
        from: ClusterId,
        page: PageId,
        writable: bool,
        zero: bool,
        out: &mut Vec<Action>,
    ) -> Result<(), ProtocolError> {
        if self.homes.get(page) != Some(from)
            || self.fetches.get(&page).map(|f| f.phase) != Some(Phase::Sc { write: writable })
            || self.entry(page).access == PageAccess::ReadWrite
        {
            return Err(Self::unexpected("sc page data", from, page));
        }
        if self.entry(page).access == PageAccess::ReadOnly {
            // The home sends data only to clusters outside its copyset, and a copy
            // leaves the copyset only through an acknowledged invalidation.
            return Err(Self::unexpected(
                "sc page data for a valid copy",
                from,
                page,
            ));
        }
        out.push(Action::Install {
            page,
            source: if zero { Source::Zero } else { Source::Attached },
            writable,
        });
        self.entry(page).access = if writable {
            PageAccess::ReadWrite
        } else {
            PageAccess::ReadOnly
        };
        self.sc_complete_fetch(page, writable, out)
    }

    pub(crate) fn on_sc_upgrade(
        &mut self,
        from: ClusterId,
        page: PageId,
        out: &mut Vec<Action>,
    ) -> Result<(), ProtocolError> {
        if self.homes.get(page) != Some(from)
            || self.fetches.get(&page).map(|f| f.phase) != Some(Phase::Sc { write: true })
            || self.entry(page).access != PageAccess::ReadOnly
        {
            return Err(Self::unexpected("sc upgrade", from, page));
        }
        out.push(Action::Unprotect { page });
        self.entry(page).access = PageAccess::ReadWrite;
        self.sc_complete_fetch(page, true, out)
    }

    pub(crate) fn on_sc_invalidate(
        &mut self,
        from: ClusterId,
        page: PageId,
        msg: Message,
        out: &mut Vec<Action>,
    ) -> Result<(), ProtocolError> {
        if self.homes.get(page) != Some(from) {
            return Err(Self::unexpected(
                "sc invalidation from a non-home",
                from,
                page,
            ));
        }
        match self.entry(page).access {
            PageAccess::ReadOnly => {
                out.push(Action::Invalidate { pages: one(page) });
                self.entry(page).access = PageAccess::Invalid;
                self.stats.invalidations += 1;
                self.send(from, Message::ScInvAck { page }, out);
                Ok(())
            }
            PageAccess::Invalid => match self.fetches.get_mut(&page) {
                // The read copy this invalidation refers to is still in flight.
                Some(f) if f.phase == (Phase::Sc { write: false }) => {
                    f.deferred.push((from, msg));
                    Ok(())
                }
                _ => Err(Self::unexpected(
                    "sc invalidation without a copy",
                    from,
                    page,
                )),
            },
            PageAccess::ReadWrite | PageAccess::Untouched => {
                Err(Self::unexpected("sc invalidation", from, page))
            }
        }
    }

    pub(crate) fn on_sc_inv_ack(
        &mut self,
        from: ClusterId,
        page: PageId,
        out: &mut Vec<Action>,
    ) -> Result<(), ProtocolError> {
        let Some(Txn {
            requester,
            write,
            acks,
            writeback_from: None,
        }) = self.dirs.get(&page).and_then(|d| d.busy)
        else {
            return Err(Self::unexpected("sc invalidation ack", from, page));
        };
        if acks == 0 {
            return Err(Self::unexpected("sc invalidation ack", from, page));
        }
        if acks > 1 {
            if let Some(t) = self.dirs.get_mut(&page).and_then(|d| d.busy.as_mut()) {
                t.acks -= 1;
            }
            return Ok(());
        }
        self.sc_finish(page, requester, write, out)?;
        self.sc_pump(page, out)
    }

    pub(crate) fn on_sc_recall(
        &mut self,
        from: ClusterId,
        page: PageId,
        invalidate: bool,
        msg: Message,
        out: &mut Vec<Action>,
    ) -> Result<(), ProtocolError> {
        if self.homes.get(page) != Some(from) {
            return Err(Self::unexpected("sc recall from a non-home", from, page));
        }
        if self.entry(page).access != PageAccess::ReadWrite {
            return match self.fetches.get_mut(&page) {
                // The write grant this recall refers to is still in flight.
                Some(f) if f.phase == (Phase::Sc { write: true }) => {
                    f.deferred.push((from, msg));
                    Ok(())
                }
                _ => Err(Self::unexpected(
                    "sc recall without write access",
                    from,
                    page,
                )),
            };
        }
        out.push(Action::WriteProtect { pages: one(page) });
        self.send(from, Message::ScWriteBack { page }, out);
        if invalidate {
            out.push(Action::Invalidate { pages: one(page) });
            self.stats.invalidations += 1;
            self.entry(page).access = PageAccess::Invalid;
        } else {
            self.entry(page).access = PageAccess::ReadOnly;
        }
        Ok(())
    }

    pub(crate) fn on_sc_write_back(
        &mut self,
        from: ClusterId,
        page: PageId,
        out: &mut Vec<Action>,
    ) -> Result<(), ProtocolError> {
        let d = self.dirs.get(&page);
        let txn = d.and_then(|d| d.busy);
        let Some(Txn {
            requester, write, ..
        }) = txn.filter(|t| {
            t.writeback_from == Some(from) && d.and_then(|d| d.remote_owner) == Some(from)
        })
        else {
            return Err(Self::unexpected("sc write-back", from, page));
        };
        if self.entry(page).access != PageAccess::Invalid {
            return Err(Self::unexpected(
                "sc write-back over a valid home copy",
                from,
                page,
            ));
        }
        out.push(Action::Install {
            page,
            source: Source::Attached,
            writable: false,
        });
        self.entry(page).access = PageAccess::ReadOnly;
        let d = self.dirs.entry(page).or_default();
        d.remote_owner = None;
        if !write {
            d.readers.insert(from);
        }
        self.sc_finish(page, requester, write, out)?;
        self.sc_pump(page, out)
    }
}
