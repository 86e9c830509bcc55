//! Counters of the daemon's own failures that it survives: a corrupt state file moved aside, a
//! state save that failed, control connections refused or cut, the run directory recreated.
//! Process-wide (the control server's tasks and the daemon's loop both count), shown by
//! `lb status` (`faults`) so that none of them is silent.

use super::reply::Counters;
use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The previous daemon's state file could not be read; it was moved aside.
    StateQuarantined,
    /// Writing the state file failed (full or read-only state directory).
    StateSaveFailed,
    /// A control connection refused: all slots busy, or its client holds too many.
    ControlRefused,
    /// A control connection that had not sent its request was closed to make room.
    ControlEvicted,
    /// The run directory or the control socket vanished and was recreated.
    SocketRecreated,
    /// The connection-table scan for clean Maglev slots failed (SYNs keep making entries).
    SlotScanFailed,
}

const ALL: [(Fault, &str); 6] = [
    (Fault::StateQuarantined, "state_file_quarantined"),
    (Fault::StateSaveFailed, "state_save_failed"),
    (Fault::ControlRefused, "control_refused"),
    (Fault::ControlEvicted, "control_evicted"),
    (Fault::SocketRecreated, "control_socket_recreated"),
    (Fault::SlotScanFailed, "slot_scan_failed"),
];

static COUNTS: [AtomicU64; ALL.len()] = [const { AtomicU64::new(0) }; ALL.len()];

/// Counts one `fault`.
pub fn count(fault: Fault) {
    COUNTS[fault as usize].fetch_add(1, Ordering::Relaxed);
}

/// Every counter by name, for `lb status`.
pub fn snapshot() -> Counters {
    Counters(ALL.iter().map(|(f, name)| ((*name).to_owned(), COUNTS[*f as usize].load(Ordering::Relaxed))).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_fault_has_its_own_named_counter() {
        for (i, (f, _)) in ALL.iter().enumerate() {
            assert_eq!(*f as usize, i);
        }
        let before = snapshot();
        count(Fault::ControlEvicted);
        let after = snapshot();
        let get = |c: &Counters, n: &str| c.0.iter().find(|(k, _)| k == n).unwrap().1;
        assert!(get(&after, "control_evicted") > get(&before, "control_evicted"));
    }
}
