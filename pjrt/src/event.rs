//! `PJRT_Event` as a Rust future.
//!
//! Invariants:
//! 1. An [`Event`] owns its `PJRT_Event*` and destroys it exactly once.
//! 2. The state handed to `PJRT_Event_OnReady` is a leaked `Box` that the
//!    callback reclaims exactly once; if registration fails, we reclaim it.
//! 3. The callback never unwinds into the plugin: its body runs inside
//!    `catch_unwind`, and a panic there is reported as an error result.

use std::ffi::c_void;
use std::future::{Future, IntoFuture};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::sync::oneshot;

use crate::error::{Error, Result};
use crate::ffi;
use crate::plugin::PluginInner;

/// A completion event. `.await` it, or call [`Event::wait`] to block.
pub struct Event {
    plugin: Arc<PluginInner>,
    raw: *mut ffi::PJRT_Event,
}

// SAFETY: PJRT events may be awaited, queried and destroyed from any thread.
unsafe impl Send for Event {}
// SAFETY: see `Send`; `&Event` only permits `is_ready`.
unsafe impl Sync for Event {}

impl Event {
    /// Takes ownership of `raw`.
    ///
    /// # Safety
    /// `raw` must be a live event of `plugin` that nobody else destroys.
    pub(crate) unsafe fn from_raw(plugin: Arc<PluginInner>, raw: *mut ffi::PJRT_Event) -> Event {
        Event { plugin, raw }
    }

    /// Whether the event has completed (successfully or not).
    pub fn is_ready(&self) -> Result<bool> {
        let mut args = ffi::PJRT_Event_IsReady_Args::new();
        args.event = self.raw;
        // SAFETY: `raw` is live (invariant 1).
        unsafe { pjrt_call!(self.plugin, PJRT_Event_IsReady, &mut args) }?;
        Ok(args.is_ready)
    }

    /// Blocks the calling thread until the event completes.
    pub fn wait(self) -> Result<()> {
        self.wait_ref()
    }

    pub(crate) fn wait_ref(&self) -> Result<()> {
        let mut args = ffi::PJRT_Event_Await_Args::new();
        args.event = self.raw;
        // SAFETY: `raw` is live; Await returns the event's status as an
        // error we own, which pjrt_call destroys.
        unsafe { pjrt_call!(self.plugin, PJRT_Event_Await, &mut args) }
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        if self.raw.is_null() {
            return;
        }
        let mut args = ffi::PJRT_Event_Destroy_Args::new();
        args.event = self.raw;
        // SAFETY: we own `raw` (invariant 1); it is not used after this.
        if let Err(e) = unsafe { pjrt_call!(self.plugin, PJRT_Event_Destroy, &mut args) } {
            tracing::warn!("PJRT_Event_Destroy: {e}");
        }
    }
}

struct OnReadyState {
    plugin: Arc<PluginInner>,
    tx: oneshot::Sender<Result<()>>,
}

unsafe extern "C" fn on_ready(error: *mut ffi::PJRT_Error, user_arg: *mut c_void) {
    // SAFETY: `user_arg` is the Box leaked in `into_future`, reclaimed here
    // exactly once (invariant 2); the plugin calls this callback once.
    let state = unsafe { Box::from_raw(user_arg.cast::<OnReadyState>()) };
    let OnReadyState { plugin, tx } = *state;
    let result = catch_unwind(AssertUnwindSafe(|| {
        if error.is_null() {
            Ok(())
        } else {
            // SAFETY: ownership of `error` passes to this callback, which
            // must destroy it; take_error does.
            let (code, message) = unsafe { plugin.take_error(error) };
            Err(Error::Pjrt {
                function: "PJRT_Event",
                code,
                message,
            })
        }
    }))
    .unwrap_or_else(|_| {
        Err(Error::Internal(
            "panic while reading a PJRT event status".into(),
        ))
    });
    // The receiver may be gone (future dropped): nothing to do then.
    let _ = tx.send(result);
}

/// The future of an [`Event`]; resolves when the event completes.
pub struct EventFuture {
    event: Option<Event>,
    state: FutureState,
}

enum FutureState {
    /// Completed before `.await`: the status, taken by the first poll.
    Done(Option<Result<()>>),
    /// The OnReady callback will send the status.
    Waiting(oneshot::Receiver<Result<()>>),
}

impl EventFuture {
    /// Blocks until completion, if the future has not resolved yet. Used by
    /// owners of memory the plugin writes into, before they free it.
    pub(crate) fn block_until_done(&mut self) {
        if let Some(ev) = &self.event {
            let _ = ev.wait_ref();
        }
    }
}

impl IntoFuture for Event {
    type Output = Result<()>;
    type IntoFuture = EventFuture;

    fn into_future(self) -> EventFuture {
        // Fast path: an event that has already completed (common for small
        // CPU programs) needs no callback, allocation or wake-up.
        if self.is_ready().unwrap_or(false) {
            return EventFuture {
                state: FutureState::Done(Some(self.wait_ref())),
                event: Some(self),
            };
        }
        let (tx, rx) = oneshot::channel();
        let state = Box::into_raw(Box::new(OnReadyState {
            plugin: self.plugin.clone(),
            tx,
        }));
        let mut args = ffi::PJRT_Event_OnReady_Args::new();
        args.event = self.raw;
        args.callback = Some(on_ready);
        args.user_arg = state.cast();
        // SAFETY: `raw` is live; `state` stays valid until the callback
        // reclaims it.
        let registered = unsafe { pjrt_call!(self.plugin, PJRT_Event_OnReady, &mut args) };
        if let Err(e) = registered {
            // SAFETY: registration failed, so the callback will never run
            // and we still own the Box (invariant 2).
            let state = unsafe { Box::from_raw(state) };
            let _ = state.tx.send(Err(e));
        }
        EventFuture {
            event: Some(self),
            state: FutureState::Waiting(rx),
        }
    }
}

impl Future for EventFuture {
    type Output = Result<()>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        let result = match &mut self.state {
            FutureState::Done(r) => r.take().unwrap_or_else(|| {
                Err(Error::Internal(
                    "EventFuture polled after completion".into(),
                ))
            }),
            FutureState::Waiting(rx) => match Pin::new(rx).poll(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(r) => r.unwrap_or_else(|_| {
                    Err(Error::Internal("PJRT event callback was dropped".into()))
                }),
            },
        };
        self.event = None;
        Poll::Ready(result)
    }
}
