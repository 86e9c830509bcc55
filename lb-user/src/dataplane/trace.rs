//! Packet tracing's data-plane side (`lb trace`): the filter, swapping the traced build of the
//! balancer (`lb_traced`) in for `lb` on every attached interface and back (one atomic link
//! update each: no packet sees an interface without a program), and reading the events.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use aya::maps::{Map, MapData, RingBuf};
use lb_common::trace::{TraceEvent, TraceFilter};

use super::{Dataplane, Program};

impl Dataplane {
    /// With a filter: writes it and attaches `lb_traced` on every interface attached through a
    /// pinned link (`link_pin(ifname)`); without: attaches `lb` again. Idempotent.
    pub fn set_tracing(&mut self, filter: Option<&TraceFilter>, link_pin: impl Fn(&str) -> PathBuf) -> Result<()> {
        if let Some(f) = filter {
            self.trace_filter.set(0, *f, 0).context("writing TRACE_FILTER")?;
        }
        self.tracing = filter.is_some();
        let mut ifnames: Vec<String> = self.links.keys().cloned().collect();
        ifnames.sort();
        for ifname in ifnames {
            self.attach_pinned(&ifname, Program::Lb, &link_pin(&ifname)).with_context(|| {
                format!("attaching the {} program to {ifname}", if self.tracing { "traced" } else { "balancer's" })
            })?;
        }
        Ok(())
    }

    /// Whether `lb_traced` is what [`Dataplane::attach_pinned`] attaches now.
    pub fn tracing(&self) -> bool {
        self.tracing
    }

    /// Writes the filter only (tests run `lb_traced` with `BPF_PROG_TEST_RUN`).
    #[cfg(feature = "test-helpers")]
    pub fn set_trace_filter(&mut self, filter: &TraceFilter) -> Result<()> {
        self.trace_filter.set(0, *filter, 0).context("writing TRACE_FILTER")
    }

    /// The events waiting in `TRACE_EVENTS`, taken.
    pub fn trace_events(&mut self) -> Vec<TraceEvent> {
        drain(&mut self.trace_events)
    }
}

/// The events ring buffer pinned in `pin_dir` (by a daemon, running or stopped with its data
/// plane kept), for `lb trace`.
pub fn open_events(pin_dir: &Path) -> Result<RingBuf<MapData>> {
    let path = pin_dir.join("TRACE_EVENTS");
    let data = MapData::from_pin(&path).with_context(|| {
        format!("opening {} (is `lb run` running with this --pin-dir, in a version with lb trace?)", path.display())
    })?;
    RingBuf::try_from(Map::RingBuf(data)).context("TRACE_EVENTS is not a ring buffer")
}

/// Takes every event waiting in `ring`.
pub fn drain(ring: &mut RingBuf<MapData>) -> Vec<TraceEvent> {
    let mut events = Vec::new();
    while let Some(item) = ring.next() {
        if item.len() >= size_of::<TraceEvent>() {
            // SAFETY: TraceEvent is plain old data; the read is unaligned-safe.
            events.push(unsafe { std::ptr::read_unaligned(item.as_ptr() as *const TraceEvent) });
        }
    }
    events
}
