//! Active-Message dispatch: a handler table indexed by the handler field, and the
//! request/reply discipline of AM-II (paper 000 §2.2).
//!
//! A message names a handler; [`Dispatcher::dispatch`] calls it. Handlers are registered as
//! *request* or *reply* handlers. A request handler may send **at most one** reply, to the
//! requester (through the source id, paper 004 §4.1); a reply handler may not reply at all —
//! so request/reply exchanges cannot cascade into unbounded chains. A message naming an
//! unregistered handler is delivered to handler 0, the error handler, with the reason.

use crate::basic::{BASIC_MAX, BasicTooLong};
use crate::endpoint::Endpoint;
use crate::message::{BasicSendError, Message, SendError};
use crate::pool::TagOnData;
use crate::word::{Express, Handler, PayloadTooWide, SourceId};
use std::time::{Duration, Instant};

/// Whether a handler serves requests (may reply once) or replies (may not reply).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HandlerKind {
    /// May send at most one reply.
    Request,
    /// May not reply.
    Reply,
}

/// Why a message went to the error handler.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum UndeliverableReason {
    /// No handler is registered at this index.
    #[error("no handler is registered at index {}", .0.0)]
    UnregisteredHandler(Handler),
}

/// A message the dispatcher could not deliver, as given to the error handler.
#[derive(Debug)]
pub struct Undeliverable {
    /// The message.
    pub message: Message,
    /// Why.
    pub reason: UndeliverableReason,
}

/// Why a reply was refused.
#[derive(Debug, thiserror::Error)]
pub enum ReplyError {
    /// This request handler already replied once (AM-II allows one reply).
    #[error("a request handler may reply at most once")]
    AlreadyReplied,
    /// Reply handlers may not reply (AM-II).
    #[error("a reply handler may not reply")]
    NotARequest,
    /// The payload does not fit an Express word.
    #[error(transparent)]
    Payload(#[from] PayloadTooWide),
    /// A Basic reply over 256 bytes.
    #[error(transparent)]
    TooLong(#[from] BasicTooLong),
    /// The reply could not be sent (the requester's queue stayed full past the reply
    /// timeout, or no route).
    #[error("reply could not be sent: {0}")]
    Send(SendError<()>),
}

/// What a handler may do besides reading its message: reply (once, for requests).
pub struct Ctx<'a> {
    endpoint: &'a Endpoint,
    source: SourceId,
    kind: HandlerKind,
    replied: bool,
    reply_timeout: Duration,
}

impl Ctx<'_> {
    /// The requester (a name in this endpoint's table).
    pub fn source(&self) -> SourceId {
        self.source
    }

    /// The endpoint the message arrived on (for sends other than the reply).
    pub fn endpoint(&self) -> &Endpoint {
        self.endpoint
    }

    fn claim_reply(&mut self) -> Result<(), ReplyError> {
        match (self.kind, self.replied) {
            (HandlerKind::Reply, _) => Err(ReplyError::NotARequest),
            (HandlerKind::Request, true) => Err(ReplyError::AlreadyReplied),
            (HandlerKind::Request, false) => {
                self.replied = true;
                Ok(())
            }
        }
    }

    /// Retries `attempt` while the requester's queue is full, up to the reply timeout. The
    /// requester drains its queues while it waits for us, so the queue frees up.
    fn retry<M>(
        &self,
        mut msg: M,
        mut attempt: impl FnMut(M) -> Result<(), SendError<M>>,
    ) -> Result<(), ReplyError> {
        let deadline = Instant::now() + self.reply_timeout;
        loop {
            match attempt(msg) {
                Ok(()) => return Ok(()),
                Err(SendError::Full(m)) if Instant::now() < deadline => {
                    msg = m;
                    std::thread::yield_now();
                }
                Err(e) => return Err(ReplyError::Send(e.map(drop))),
            }
        }
    }

    /// Replies with an Express message.
    ///
    /// # Errors
    /// [`ReplyError`]: second reply, reply from a reply handler, wide payload, send failure.
    pub fn reply_express(&mut self, handler: Handler, payload: u64) -> Result<(), ReplyError> {
        let msg = Express::new(handler, payload)?;
        self.claim_reply()?;
        let to = self.source;
        self.retry(msg, |m| self.endpoint.reply_express(to, m))
    }

    /// Replies with a Tag-On message.
    ///
    /// # Errors
    /// As [`Ctx::reply_express`].
    pub fn reply_tag_on(
        &mut self,
        handler: Handler,
        data: impl Into<TagOnData>,
    ) -> Result<(), ReplyError> {
        self.claim_reply()?;
        let to = self.source.into();
        self.retry(data.into(), |d| self.endpoint.send_tag_on(to, handler, d))
    }

    /// Replies with a Basic message of at most 256 bytes.
    ///
    /// # Errors
    /// As [`Ctx::reply_express`], plus [`ReplyError::TooLong`].
    pub fn reply_basic(&mut self, handler: Handler, data: &[u8]) -> Result<(), ReplyError> {
        if data.len() > BASIC_MAX {
            return Err(BasicTooLong(data.len()).into());
        }
        self.claim_reply()?;
        let to = self.source.into();
        self.retry((), |()| match self.endpoint.send_basic(to, handler, data) {
            Ok(()) => Ok(()),
            Err(BasicSendError::Send(e)) => Err(e),
            // Checked above; report it as a routing failure rather than panic.
            Err(BasicSendError::TooLong(_)) => Err(SendError::Timeout(())),
        })
    }

    /// True if this handler has replied.
    pub fn replied(&self) -> bool {
        self.replied
    }
}

type HandlerFn<S> = Box<dyn FnMut(&mut Ctx<'_>, &mut S, Message) + Send>;
type ErrorFn<S> = Box<dyn FnMut(&mut S, Undeliverable) + Send>;

/// Registering a handler failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RegisterError {
    /// Index 0 is reserved for the error handler.
    #[error("handler index 0 is reserved for the error handler")]
    Reserved,
    /// Another handler holds this index.
    #[error("a handler is already registered at index {}", .0.0)]
    Taken(Handler),
}

/// A table of 256 handlers over user state `S` (see the module docs).
pub struct Dispatcher<S> {
    handlers: Vec<Option<(HandlerKind, HandlerFn<S>)>>,
    error: ErrorFn<S>,
    reply_timeout: Duration,
}

impl<S> std::fmt::Debug for Dispatcher<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let registered: Vec<usize> = self
            .handlers
            .iter()
            .enumerate()
            .filter(|(_, h)| h.is_some())
            .map(|(i, _)| i)
            .collect();
        f.debug_struct("Dispatcher")
            .field("registered", &registered)
            .finish()
    }
}

impl<S> Dispatcher<S> {
    /// A dispatcher whose error handler (index 0) is `on_error`.
    pub fn new(on_error: impl FnMut(&mut S, Undeliverable) + Send + 'static) -> Dispatcher<S> {
        Dispatcher {
            handlers: (0..256).map(|_| None).collect(),
            error: Box::new(on_error),
            reply_timeout: Duration::from_secs(10),
        }
    }

    /// Sets how long a reply waits for room in the requester's queue (default 10 s).
    pub fn set_reply_timeout(&mut self, timeout: Duration) {
        self.reply_timeout = timeout;
    }

    /// Registers `f` at index `handler`.
    ///
    /// # Errors
    /// [`RegisterError`] for index 0 or a taken index.
    pub fn register(
        &mut self,
        handler: Handler,
        kind: HandlerKind,
        f: impl FnMut(&mut Ctx<'_>, &mut S, Message) + Send + 'static,
    ) -> Result<(), RegisterError> {
        if handler == Handler::ERROR {
            return Err(RegisterError::Reserved);
        }
        let slot = &mut self.handlers[usize::from(handler.0)];
        if slot.is_some() {
            return Err(RegisterError::Taken(handler));
        }
        *slot = Some((kind, Box::new(f)));
        Ok(())
    }

    /// Runs the handler `message` names, or the error handler.
    pub fn dispatch(&mut self, endpoint: &Endpoint, state: &mut S, message: Message) {
        let h = message.handler();
        match self.handlers[usize::from(h.0)].as_mut() {
            Some((kind, f)) => {
                let mut ctx = Ctx {
                    endpoint,
                    source: message.source(),
                    kind: *kind,
                    replied: false,
                    reply_timeout: self.reply_timeout,
                };
                f(&mut ctx, state, message);
            }
            None => (self.error)(
                state,
                Undeliverable {
                    message,
                    reason: UndeliverableReason::UnregisteredHandler(h),
                },
            ),
        }
    }

    /// Polls `endpoint` once (OnePoll) and dispatches what it finds. Returns true if a
    /// message was handled.
    pub fn poll(&mut self, endpoint: &Endpoint, state: &mut S) -> bool {
        match endpoint.try_recv() {
            Some(m) => {
                self.dispatch(endpoint, state, m);
                true
            }
            None => false,
        }
    }
}
