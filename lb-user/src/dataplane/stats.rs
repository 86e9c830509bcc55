//! Counters: the global ones, one record per (service, class) and one per backend, summed
//! over CPUs.

use anyhow::{Context, Result};
use aya::maps::{MapData, PerCpuArray};
use lb_common::maps::{stat, BackendCounters, GlobalStats};

use super::Dataplane;

/// Counters of one (service, class).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClassStats {
    pub service: u32,
    pub class: u32,
    pub packets: u64,
    pub bytes: u64,
    pub new_flows: u64,
    pub spills: u64,
}

/// All counters, summed over CPUs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Indexed by `lb_common::maps::stat::*` (`stat::NAMES` names them).
    pub global: Vec<u64>,
    /// Only pairs with a non-zero counter.
    pub classes: Vec<ClassStats>,
}

impl Stats {
    pub fn get(&self, index: u32) -> u64 {
        self.global.get(index as usize).copied().unwrap_or(0)
    }

    /// Counters of a service: the sum over its classes (`class` field = 0).
    pub fn service(&self, service: u32) -> ClassStats {
        self.classes.iter().filter(|c| c.service == service).fold(
            ClassStats { service, ..Default::default() },
            |a, c| ClassStats {
                packets: a.packets + c.packets,
                bytes: a.bytes + c.bytes,
                new_flows: a.new_flows + c.new_flows,
                spills: a.spills + c.spills,
                ..a
            },
        )
    }

    pub fn class(&self, service: u32, class: u32) -> ClassStats {
        self.classes.iter().find(|c| c.service == service && c.class == class).copied().unwrap_or(ClassStats {
            service,
            class,
            ..Default::default()
        })
    }
}

impl Dataplane {
    /// All counters, summed over CPUs.
    pub fn stats(&self) -> Result<Stats> {
        let global = global_counters(&self.stats)?;
        let mut classes = Vec::new();
        let cps = self.sizes.classes_per_service;
        for service in 0..self.sizes.max_services {
            for class in 0..cps {
                let per_cpu = self.class_stats.get(&(service * cps + class), 0)?;
                let c = per_cpu.iter().fold(ClassStats { service, class, ..Default::default() }, |a, v| ClassStats {
                    packets: a.packets + v.packets,
                    bytes: a.bytes + v.bytes,
                    new_flows: a.new_flows + v.new_flows,
                    spills: a.spills + v.spills,
                    ..a
                });
                if c.packets + c.bytes + c.new_flows + c.spills != 0 {
                    classes.push(c);
                }
            }
        }
        Ok(Stats { global, classes })
    }

    /// Backend `id`'s counters (`BACKEND_STATS`), summed over CPUs.
    pub fn backend_stats(&self, id: u32) -> Result<BackendCounters> {
        let per_cpu = self.backend_stats.get(&id, 0).with_context(|| format!("reading BACKEND_STATS[{id}]"))?;
        Ok(per_cpu.iter().fold(BackendCounters::default(), |a, v| BackendCounters {
            packets: a.packets + v.packets,
            bytes: a.bytes + v.bytes,
            new_flows: a.new_flows + v.new_flows,
        }))
    }

    /// Zeroes backend `id`'s counters (the id goes to another backend).
    pub(super) fn reset_backend_stats(&mut self, id: u32) -> Result<()> {
        let zeros = vec![BackendCounters::default(); aya::util::nr_cpus().map_err(|(_, e)| e)?];
        self.backend_stats.set(id, aya::maps::PerCpuValues::try_from(zeros)?, 0).context("resetting BACKEND_STATS")
    }
}

/// The global counters of an object's `STATS` record, summed over CPUs.
pub(crate) fn global_counters(stats: &PerCpuArray<MapData, GlobalStats>) -> Result<Vec<u64>> {
    let mut global = vec![0u64; stat::GLOBAL_COUNT as usize];
    for cpu in stats.get(&0, 0)?.iter() {
        for (sum, v) in global.iter_mut().zip(cpu.counters.iter()) {
            *sum += v;
        }
    }
    Ok(global)
}
