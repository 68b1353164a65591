//! Hardware profiles (`knowledge/hardware/*.toml`): the numbers a proposer and the roofline
//! need about a device. One file per device; new files are picked up without code changes.

use crate::error::KnowledgeError;
use crate::files::{read_toml, toml_files};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceKind {
    Cpu,
    Gpu,
}

/// Off-chip memory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Memory {
    /// Peak (datasheet) or measured bandwidth in GB/s (10^9 bytes per second).
    pub bandwidth_gbs: f64,
    #[serde(default)]
    pub capacity_gib: Option<f64>,
}

/// On-chip storage. GPU fields are per SM / per thread block; CPU fields per core unless named
/// otherwise. Absent means unknown or not applicable.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OnChip {
    pub registers_per_unit: Option<u64>,
    pub max_registers_per_thread: Option<u64>,
    pub vector_registers: Option<u64>,
    pub shared_memory_per_unit_kib: Option<f64>,
    pub shared_memory_per_block_kib: Option<f64>,
    pub l1_kib: Option<f64>,
    pub l2_kib: Option<f64>,
    /// Last-level cache shared by the whole device (GPU L2, CPU L3), in MiB.
    pub llc_mib: Option<f64>,
}

/// How work is spread over the device.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Parallelism {
    /// SMs of a GPU, cores of a CPU.
    pub compute_units: u64,
    /// f32 lanes of one CPU vector instruction, or threads of a GPU warp.
    pub simd_width: u64,
    #[serde(default)]
    pub max_threads_per_block: Option<u64>,
    #[serde(default)]
    pub max_threads_per_unit: Option<u64>,
    #[serde(default)]
    pub clock_ghz: Option<f64>,
}

/// One device.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HardwareProfile {
    /// Equal to the file stem; what `lookup` matches first.
    pub name: String,
    pub title: String,
    pub kind: DeviceKind,
    #[serde(default)]
    pub vendor: String,
    /// Other names the device reports (e.g. `NVIDIA H200`), matched case-insensitively.
    #[serde(default)]
    pub aliases: Vec<String>,
    pub memory: Memory,
    /// Dense peak throughput in TFLOP/s (or TOP/s for integer types) by dtype
    /// (`f64`, `f32`, `tf32`, `bf16`, `f16`, `fp8`, `int8`, …).
    pub peak_tflops: BTreeMap<String, f64>,
    #[serde(default)]
    pub on_chip: OnChip,
    pub parallelism: Parallelism,
    /// Where the numbers come from; required so every number can be checked.
    pub source: Vec<String>,
    #[serde(default)]
    pub notes: String,
}

impl HardwareProfile {
    /// Loads every `*.toml` in `dir` (name order). The `name` field must equal the file stem
    /// so a profile is found where its name says.
    pub fn load_all(dir: &Path) -> Result<Vec<HardwareProfile>, KnowledgeError> {
        let mut out: Vec<HardwareProfile> = Vec::new();
        for path in toml_files(dir)? {
            let p: HardwareProfile = read_toml(&path)?;
            let invalid = |field: &str, m: String| KnowledgeError::invalid(&path, field, m);
            let stem = path.file_stem().map(|s| s.to_string_lossy().into_owned());
            if stem.as_deref() != Some(p.name.as_str()) {
                return Err(invalid(
                    "name",
                    format!("{:?} must equal the file stem", p.name),
                ));
            }
            if p.source.iter().all(|s| s.trim().is_empty()) {
                return Err(invalid("source", "cite at least one source".into()));
            }
            if !(p.memory.bandwidth_gbs.is_finite() && p.memory.bandwidth_gbs > 0.0) {
                return Err(invalid("memory.bandwidth_gbs", "must be positive".into()));
            }
            if p.peak_tflops.is_empty() {
                return Err(invalid("peak_tflops", "list at least one dtype".into()));
            }
            if let Some((dtype, v)) = p
                .peak_tflops
                .iter()
                .find(|(_, v)| !(v.is_finite() && **v > 0.0))
            {
                return Err(invalid(
                    &format!("peak_tflops.{dtype}"),
                    format!("{v} must be positive"),
                ));
            }
            if p.parallelism.compute_units == 0 || p.parallelism.simd_width == 0 {
                return Err(invalid(
                    "parallelism",
                    "compute_units and simd_width must be positive".into(),
                ));
            }
            for other in &out {
                let clash = p.names().find(|n| other.matches(n));
                if let Some(n) = clash {
                    return Err(invalid(
                        "aliases",
                        format!("{n:?} also names profile {:?}", other.name),
                    ));
                }
            }
            out.push(p);
        }
        Ok(out)
    }

    /// The profile called `name` (or with that alias) in `profiles`.
    pub fn find<'a>(profiles: &'a [HardwareProfile], name: &str) -> Option<&'a HardwareProfile> {
        profiles
            .iter()
            .find(|p| p.name == name)
            .or_else(|| profiles.iter().find(|p| p.matches(name)))
    }

    /// Whether `name` is this profile's name or one of its aliases (case-insensitive).
    pub fn matches(&self, name: &str) -> bool {
        self.names().any(|n| n.eq_ignore_ascii_case(name.trim()))
    }

    fn names(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.name.as_str()).chain(self.aliases.iter().map(String::as_str))
    }

    /// Peak throughput for `dtype` in FLOP/s.
    pub fn peak_flops(&self, dtype: &str) -> Option<f64> {
        self.peak_tflops.get(dtype).map(|t| t * 1e12)
    }

    /// Arithmetic intensity (FLOP/byte) above which `dtype` work is compute bound.
    pub fn ridge_point(&self, dtype: &str) -> Option<f64> {
        self.peak_flops(dtype)
            .map(|f| f / (self.memory.bandwidth_gbs * 1e9))
    }
}
