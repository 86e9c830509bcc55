//! The interfaces and pins under a running daemon: interfaces that go and come back, MAC
//! changes, pins removed by hand, and the backends' next hops kept resolved.

use super::*;

impl Daemon {
    /// An interface event: one of ours removed is logged (once) and shows as detached in
    /// `lb status`; when an interface of that name exists again, the balancer is attached to it.
    pub(super) fn on_link(&mut self, ev: links::LinkEvent) {
        match ev {
            links::LinkEvent::Removed { ifname, .. } if self.args.interfaces.contains(&ifname) => {
                self.note_removed(&ifname)
            }
            links::LinkEvent::Present { ifname, .. } if self.args.interfaces.contains(&ifname) => {
                self.attach_again(&ifname);
                self.follow_mac(&ifname);
            }
            links::LinkEvent::Overrun => self.check_links(),
            _ => {}
        }
    }

    pub(super) fn note_removed(&mut self, ifname: &str) {
        if self.links.detached.insert(ifname.to_owned()) {
            tracing::warn!("interface {ifname} was removed: the balancer is detached from it until an interface of that name returns");
        }
    }

    /// Attaches to `ifname` again if its link was severed (a new link replaces the pinned one).
    pub(super) fn attach_again(&mut self, ifname: &str) {
        if self.dp.link_attached(ifname) {
            self.links.detached.remove(ifname);
            return;
        }
        match self.dp.attach_pinned(ifname, Program::Lb, &pinning::link_pin(&self.args.pin_dir, ifname)) {
            Ok(how) => {
                self.links.detached.remove(ifname);
                tracing::info!("interface {ifname} is back: {how}");
            }
            // Gone again by now: a link going away is first reported changed (down), then
            // removed; that is no failed return.
            Err(_) if !links::exists(ifname) => self.note_removed(ifname),
            Err(e) => tracing::error!("interface {ifname} is back, but attaching to it failed (retried at its next change and every few seconds): {e:#}"),
        }
    }

    /// Every interface's link, looked at again (after lost events, and at every tick).
    pub(super) fn check_links(&mut self) {
        for ifname in self.args.interfaces.clone() {
            if self.dp.link_attached(&ifname) {
                self.follow_mac(&ifname);
                continue;
            }
            if links::exists(&ifname) {
                self.attach_again(&ifname);
            } else {
                self.note_removed(&ifname);
            }
        }
    }

    /// Registers `ifname`'s MAC again if it changed (a change event, and every tick).
    pub(super) fn follow_mac(&mut self, ifname: &str) {
        if links::exists(ifname) {
            let outcome = self.dp.follow_mac(ifname);
            // A new MAC makes the kernel drop the interface's neighbour entries: the next hops
            // to the backends are resolved again at once, not at the keeper's next round (up
            // to 10 s of drop_no_neigh, long enough for an established TCP flow's
            // retransmissions to back off past its peer's patience).
            if matches!(outcome, Ok(Some(_))) {
                self.keep_neighbours();
            }
            self.links.macs.record(ifname, outcome);
        }
    }

    /// Pins removed from the pin directory (by hand, or the directory itself): the program
    /// stays attached while this daemon holds its link, but it stops when the daemon exits, and
    /// a restart could not adopt the maps. Logged once per loss; shown by `lb status`.
    pub(super) fn check_pins(&mut self) {
        let missing = pinning::missing_pins(&self.args.pin_dir, &self.args.interfaces);
        if missing.is_empty() && !self.links.pins_lost.is_empty() {
            tracing::info!("the pins in {} are complete again", self.args.pin_dir.display());
        } else if !missing.is_empty() && missing != self.links.pins_lost {
            tracing::error!(
                "pins in {} were removed ({}): the balancer stays attached while this daemon runs, but it stops when the daemon exits and a restart cannot adopt its maps (tracked connections would be lost); restart the daemon to pin them again",
                self.args.pin_dir.display(),
                missing.join(", ")
            );
        }
        self.links.pins_lost = missing;
    }

    /// Each interface's attachment, for `lb status`.
    pub(super) fn link_status(&self) -> Vec<LinkStatus> {
        self.args
            .interfaces
            .iter()
            .map(|ifname| {
                let state = if self.dp.link_attached(ifname) {
                    "attached"
                } else if links::exists(ifname) {
                    "detached"
                } else {
                    "detached (interface removed)"
                };
                LinkStatus { interface: ifname.clone(), state: state.to_owned(), mac: self.links.macs.note(ifname) }
            })
            .chain(self.links.unlisted.iter().cloned())
            .collect()
    }

    /// Hands the configured backends to the neighbour keeper (see `neighbours`).
    pub(super) fn keep_neighbours(&self) {
        let backends = self
            .ctl
            .config()
            .services
            .iter()
            .flat_map(|s| s.backends.iter().flat_map(|b| b.addresses().iter().copied()))
            .collect();
        self.neighbours.keep(backends);
    }
}
