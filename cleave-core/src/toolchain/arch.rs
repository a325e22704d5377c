//! GPU architectures: which ones we build for, parsed from `CUDA_COMPUTE_CAP`.

use std::fmt;

use crate::arch::{Arch as Budget, SM80, SM90};

/// How specific an architecture's code is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Variant {
    /// Plain `sm_XY`: runs on this architecture and newer minor revisions of it.
    Generic,
    /// `sm_XYa`: may use architecture-specific instructions (wgmma, TMA multicast) and runs on
    /// exactly this architecture.
    Specific,
    /// `sm_XYf`: family-specific code that runs on this architecture's family.
    Family,
}

/// A compute capability, e.g. 8.0 or 9.0a.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Arch {
    /// The major version: 8 for sm_80.
    pub major: u32,
    /// The minor version: 6 for sm_86.
    pub minor: u32,
    /// The `a`/`f` suffix.
    pub variant: Variant,
}

/// What we know about one architecture.
struct Known {
    major: u32,
    minor: u32,
    /// The largest shared memory one block can opt in to, in bytes (the CUDA programming guide's
    /// "maximum amount of shared memory per thread block").
    smem_per_block: u32,
    /// The first nvcc release that can target it.
    nvcc: (u32, u32),
    /// The first nvcc release with its `a` variant, if it has one.
    specific: Option<(u32, u32)>,
    /// The first nvcc release with its `f` variant, if it has one.
    family: Option<(u32, u32)>,
}

const fn known(
    major: u32,
    minor: u32,
    smem_per_block: u32,
    nvcc: (u32, u32),
    specific: Option<(u32, u32)>,
    family: Option<(u32, u32)>,
) -> Known {
    Known { major, minor, smem_per_block, nvcc, specific, family }
}

/// Architectures Cleave's kernels can target: mma.sync with bf16 and cp.async need sm_80.
const KNOWN: &[Known] = &[
    known(8, 0, 166_912, (11, 0), None, None),
    known(8, 6, 101_376, (11, 1), None, None),
    known(8, 7, 166_912, (11, 4), None, None),
    known(8, 9, 101_376, (11, 8), None, None),
    known(9, 0, 232_448, (11, 8), Some((12, 0)), None),
    known(10, 0, 232_448, (12, 8), Some((12, 8)), Some((12, 9))),
    known(10, 3, 232_448, (12, 9), Some((12, 9)), Some((12, 9))),
    known(12, 0, 101_376, (12, 8), Some((12, 8)), Some((12, 9))),
    known(12, 1, 101_376, (12, 9), Some((12, 9)), Some((12, 9))),
];

/// What `CUDA_COMPUTE_CAP=all` means: the architectures we support and test.
const ALL: &[(u32, u32)] = &[(8, 0), (8, 6), (8, 9), (9, 0)];

impl Arch {
    /// sm_80.
    pub const SM_80: Arch = Arch { major: 8, minor: 0, variant: Variant::Generic };
    /// sm_90.
    pub const SM_90: Arch = Arch { major: 9, minor: 0, variant: Variant::Generic };

    fn known(self) -> Option<&'static Known> {
        KNOWN.iter().find(|k| k.major == self.major && k.minor == self.minor)
    }

    /// The number nvcc uses: 80 for 8.0, 120 for 12.0.
    pub fn number(self) -> u32 {
        self.major * 10 + self.minor
    }

    fn suffix(self) -> &'static str {
        match self.variant {
            Variant::Generic => "",
            Variant::Specific => "a",
            Variant::Family => "f",
        }
    }

    /// The real-architecture name, e.g. `sm_90a`.
    pub fn sm(self) -> String {
        format!("sm_{}{}", self.number(), self.suffix())
    }

    /// The virtual-architecture name, e.g. `compute_90a`.
    pub fn compute(self) -> String {
        format!("compute_{}{}", self.number(), self.suffix())
    }

    /// The most shared memory (static plus dynamic) one block may use, in bytes; `None` for an
    /// architecture we do not know.
    pub fn smem_per_block(self) -> Option<u32> {
        self.known().map(|k| k.smem_per_block)
    }

    /// The oldest nvcc (major, minor) that can compile for this architecture.
    pub fn min_nvcc(self) -> Option<(u32, u32)> {
        let k = self.known()?;
        match self.variant {
            Variant::Generic => Some(k.nvcc),
            Variant::Specific => k.specific,
            Variant::Family => k.family,
        }
    }

    /// Parses one architecture: `80`, `8.0`, `sm_80`, `compute_80`, with an optional `a` or
    /// `f` suffix (`90a`, `9.0a`, `sm_90a`).
    pub fn parse(token: &str) -> Result<Arch, ArchError> {
        let fail = |reason: String| ArchError { token: token.to_owned(), reason };
        let lower = token.trim().to_ascii_lowercase();
        let body = lower.strip_prefix("sm_").or_else(|| lower.strip_prefix("compute_")).unwrap_or(&lower);
        let (digits, variant) = match body.as_bytes().last() {
            Some(b'a') => (&body[..body.len() - 1], Variant::Specific),
            Some(b'f') => (&body[..body.len() - 1], Variant::Family),
            _ => (body, Variant::Generic),
        };
        let (major, minor) = match digits.split_once('.') {
            Some((major, minor)) if is_digits(major) && minor.len() == 1 && is_digits(minor) => (major, minor),
            None if (2..=3).contains(&digits.len()) && is_digits(digits) => digits.split_at(digits.len() - 1),
            _ => return Err(fail("expected a compute capability such as 80, 8.0, sm_80 or 90a".to_owned())),
        };
        let arch = Arch {
            major: major.parse().map_err(|_| fail("the major version is too large".to_owned()))?,
            minor: minor.parse().map_err(|_| fail("the minor version is not a digit".to_owned()))?,
            variant,
        };
        if arch.major < 8 {
            return Err(fail(format!(
                "{} is older than sm_80, the oldest architecture Cleave's kernels support",
                arch.sm()
            )));
        }
        if arch.known().is_none() {
            let names: Vec<String> = KNOWN.iter().map(|k| k.major * 10 + k.minor).map(|n| n.to_string()).collect();
            return Err(fail(format!("unknown architecture {}; known: {}", arch.sm(), names.join(", "))));
        }
        if arch.min_nvcc().is_none() {
            return Err(fail(format!(
                "{} has no `{}` variant",
                Arch { variant: Variant::Generic, ..arch }.sm(),
                arch.suffix()
            )));
        }
        Ok(arch)
    }
}

fn is_digits(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())
}

impl fmt::Display for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sm_{}{}", self.number(), self.suffix())
    }
}

/// The scheduler's budget for one architecture: the sm_80 or sm_90 model with the
/// architecture's own shared-memory limit.
fn budget_of(a: Arch) -> Budget {
    let mut b = if a.major >= 9 { SM90 } else { SM80 };
    if let Some(smem) = a.smem_per_block() {
        b.smem_per_block = b.smem_per_block.min(u64::from(smem));
        b.smem_per_sm = b.smem_per_sm.min(u64::from(smem) + 1024);
    }
    b
}

/// One plan of a build: the budget it is made for and the GPUs it is meant for.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanTarget {
    /// The oldest GPU it serves, e.g. `sm_86`: names the plan in the lockfile and suffixes its
    /// kernels' symbols.
    pub name: String,
    /// That GPU's compute capability as nvcc numbers it (86): the launcher takes this plan only
    /// on a GPU of at least this capability.
    pub min_cc: u32,
    /// What the plan is scheduled against.
    pub budget: Budget,
}

/// A `CUDA_COMPUTE_CAP` entry that could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("CUDA_COMPUTE_CAP entry `{token}`: {reason}")]
pub struct ArchError {
    /// The offending entry.
    pub token: String,
    /// Why it was rejected.
    pub reason: String,
}

/// The architectures one build targets: SASS (machine code) for each of `sass`, plus PTX for
/// `ptx`, which the driver compiles for GPUs newer than every SASS target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArchSet {
    sass: Vec<Arch>,
    ptx: Option<Arch>,
}

impl Default for ArchSet {
    /// SASS for sm_80 and sm_90 and PTX for compute_90: native code for A100 and H100/H200,
    /// and code the driver can compile for anything newer.
    fn default() -> Self {
        ArchSet { sass: vec![Arch::SM_80, Arch::SM_90], ptx: Some(Arch::SM_90) }
    }
}

/// The variable that selects architectures.
pub const COMPUTE_CAP_VAR: &str = "CUDA_COMPUTE_CAP";

impl ArchSet {
    /// Builds a set from SASS targets (sorted, without duplicates); PTX is emitted for the
    /// newest generic one. Arch-specific (`a`/`f`) targets never get PTX, because their PTX is
    /// not forward-compatible.
    pub fn new(sass: impl IntoIterator<Item = Arch>) -> ArchSet {
        let mut sass: Vec<Arch> = sass.into_iter().collect();
        sass.sort();
        sass.dedup();
        let ptx = sass.iter().rev().find(|a| a.variant == Variant::Generic).copied();
        ArchSet { sass, ptx }
    }

    /// The architectures of `CUDA_COMPUTE_CAP=all`: 80, 86, 89 and 90, with compute_90 PTX.
    pub fn all() -> ArchSet {
        ArchSet::new(ALL.iter().map(|&(major, minor)| Arch { major, minor, variant: Variant::Generic }))
    }

    /// Parses a `CUDA_COMPUTE_CAP` value: entries separated by commas, semicolons or white
    /// space, each an architecture (see [`Arch::parse`]) or `all`. A blank value means the
    /// default set.
    pub fn parse(value: &str) -> Result<ArchSet, ArchError> {
        let tokens: Vec<&str> =
            value.split(|c: char| c == ',' || c == ';' || c.is_whitespace()).filter(|t| !t.is_empty()).collect();
        if tokens.is_empty() {
            return Ok(ArchSet::default());
        }
        let mut sass = Vec::new();
        for token in tokens {
            if token.eq_ignore_ascii_case("all") {
                sass.extend(ArchSet::all().sass);
            } else {
                sass.push(Arch::parse(token)?);
            }
        }
        Ok(ArchSet::new(sass))
    }

    /// The set `CUDA_COMPUTE_CAP` selects, read through `env`; unset means the default set.
    /// The GPU of the build machine is never consulted (no `nvidia-smi`).
    pub fn from_env(env: impl Fn(&str) -> Option<std::ffi::OsString>) -> Result<ArchSet, ArchError> {
        match env(COMPUTE_CAP_VAR) {
            None => Ok(ArchSet::default()),
            Some(value) => match value.to_str() {
                Some(value) => ArchSet::parse(value),
                None => Err(ArchError {
                    token: value.to_string_lossy().into_owned(),
                    reason: "the value is not valid UTF-8".to_owned(),
                }),
            },
        }
    }

    /// The SASS targets, oldest first.
    pub fn sass(&self) -> &[Arch] {
        &self.sass
    }

    /// The PTX target, if any.
    pub fn ptx(&self) -> Option<Arch> {
        self.ptx
    }

    /// The scheduler's budgets for this set: the sm_80 or sm_90 model of each SASS target,
    /// with that architecture's own shared-memory limit (sm_86 and sm_89 grant 99 KiB per
    /// block where the A100 grants 163). The build, the macro and the command line all plan
    /// through this, so `cleave schedule --arch` shows what a build would choose.
    pub fn budgets(&self) -> Vec<Budget> {
        let mut out: Vec<Budget> = self.sass.iter().map(|&a| budget_of(a)).collect();
        out.dedup();
        if out.is_empty() {
            out = vec![SM80, SM90];
        }
        out
    }

    /// The plans one build makes: one per kind of GPU its code runs on, newest first. A GPU
    /// runs the SASS of the newest target of its major version at or below its own, or, when
    /// it is newer than every SASS target, the PTX. So the sm_80 SASS of the default set also
    /// runs on sm_86 and sm_89, which allow 99 KiB of shared memory per block where the A100
    /// allows 163: each distinct budget among the known GPUs a target serves gets its own plan,
    /// which the launcher picks by the device it finds ([`PlanTarget::min_cc`] and the plan's
    /// shared memory). GPUs that only the PTX serves get no plan of their own: they take the
    /// newest plan that fits them.
    pub fn plan_targets(&self) -> Vec<PlanTarget> {
        let mut out: Vec<PlanTarget> = Vec::new();
        for (i, a) in self.sass.iter().enumerate() {
            // The known GPUs whose code this SASS target is: its major version, from its own
            // minor up to the next SASS target of that major version.
            let next = self.sass[i + 1..].iter().find(|b| b.major == a.major && b.minor > a.minor).map(|b| b.minor);
            let served =
                KNOWN.iter().filter(|k| k.major == a.major && k.minor >= a.minor && next.is_none_or(|n| k.minor < n));
            for k in served {
                let gpu = Arch { major: k.major, minor: k.minor, variant: Variant::Generic };
                let budget = budget_of(gpu);
                match out.iter_mut().find(|t| t.budget == budget) {
                    Some(t) => t.min_cc = t.min_cc.min(gpu.number()),
                    None => out.push(PlanTarget { name: gpu.sm(), min_cc: gpu.number(), budget }),
                }
            }
        }
        if out.is_empty() {
            out = [Arch::SM_90, Arch::SM_80]
                .iter()
                .map(|&a| PlanTarget { name: a.sm(), min_cc: a.number(), budget: budget_of(a) })
                .collect();
        }
        // Newest first: the launcher takes the first plan a GPU can run.
        out.sort_by_key(|t| std::cmp::Reverse(t.min_cc));
        out
    }

    /// The lowest `__CUDA_ARCH__` whose code must hold a plan meant for GPUs of compute
    /// capability `min_cc` and newer, when that is above the set's oldest (`None`: every code
    /// of the set must hold it). A GPU runs the newest SASS of its major version at or below its
    /// own, else the PTX; when the PTX is the newest target, every GPU a plan can be picked on
    /// runs code at least as new as the newest target at or below `min_cc`. So the sm_90 plan
    /// of the default set is compiled into the sm_90 SASS and PTX alone, not into the sm_80
    /// SASS where nothing picks it. With older PTX (`80,90a`) a newer GPU runs that PTX and may
    /// pick any plan, so nothing is left out.
    pub fn code_floor(&self, min_cc: u32) -> Option<u32> {
        let numbers = || self.sass.iter().map(|a| a.number());
        let newest = numbers().max()?;
        if self.ptx.map(Arch::number) != Some(newest) {
            return None;
        }
        let floor = numbers().filter(|&n| n <= min_cc).max()?;
        (floor > numbers().min()?).then_some(floor * 10)
    }

    /// Whether the set targets nothing (possible only through [`ArchSet::new`]).
    pub fn is_empty(&self) -> bool {
        self.sass.is_empty()
    }

    /// nvcc's `-gencode` flags: one per SASS target, with the PTX target's PTX added to its
    /// SASS entry (`arch=compute_90,code=[sm_90,compute_90]`).
    pub fn gencode_flags(&self) -> Vec<String> {
        self.sass
            .iter()
            .map(|a| {
                if Some(*a) == self.ptx {
                    format!("-gencode=arch={},code=[{},{}]", a.compute(), a.sm(), a.compute())
                } else {
                    format!("-gencode=arch={},code={}", a.compute(), a.sm())
                }
            })
            .collect()
    }

    /// A description for error messages and `Fatbin::built_for`, e.g. `sm_80, sm_90, compute_90`.
    pub fn describe(&self) -> String {
        let mut names: Vec<String> = self.sass.iter().map(|a| a.sm()).collect();
        names.extend(self.ptx.map(Arch::compute));
        names.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::common;

    #[test]
    fn budgets_follow_the_architectures() {
        assert_eq!(ArchSet::default().budgets(), vec![SM80, SM90]);
        let b = ArchSet::parse("86").unwrap().budgets();
        assert_eq!(b.len(), 1);
        assert_eq!((b[0].smem_per_block, b[0].smem_per_sm), (101_376, 102_400));
        // Listing sm_89 next to the defaults bounds the one common plan by its 99 KiB.
        let b = ArchSet::parse("80,89,90").unwrap().budgets();
        assert_eq!(common(&b).smem_per_block, 101_376);
        assert_eq!(common(&b).sms, 108);
    }

    #[test]
    fn every_kind_of_gpu_a_build_runs_on_gets_a_plan() {
        let show = |set: &str| -> Vec<(String, u32, u64, u32)> {
            ArchSet::parse(set)
                .unwrap()
                .plan_targets()
                .into_iter()
                .map(|t| (t.name, t.min_cc, t.budget.smem_per_block, t.budget.sms))
                .collect()
        };
        let t = |name: &str, cc, smem, sms| (name.to_string(), cc, smem, sms);
        // The default SASS for sm_80 also runs on the 99 KiB sm_86 and sm_89; sm_87 has the
        // A100's limit and shares its plan.
        let default = vec![t("sm_90", 90, 232_448, 132), t("sm_86", 86, 101_376, 108), t("sm_80", 80, 166_912, 108)];
        assert_eq!(show(""), default);
        // With sm_86 SASS of its own, sm_80's code serves only the A100 (and nothing changes).
        assert_eq!(show("all"), default);
        // sm_86 SASS alone also runs on sm_87, which allows 163 KiB.
        assert_eq!(show("86"), vec![t("sm_87", 87, 166_912, 108), t("sm_86", 86, 101_376, 108)]);
        assert_eq!(show("90"), vec![t("sm_90", 90, 232_448, 132)]);
        assert_eq!(show("89,90a"), vec![t("sm_90", 90, 232_448, 132), t("sm_89", 89, 101_376, 108)]);
    }

    #[test]
    fn a_plan_is_left_out_only_of_code_no_gpu_that_picks_it_runs() {
        let set = ArchSet::default();
        assert_eq!(set.code_floor(90), Some(900));
        assert_eq!(set.code_floor(86), None);
        assert_eq!(set.code_floor(80), None);
        let all = ArchSet::all();
        assert_eq!(
            (all.code_floor(90), all.code_floor(89), all.code_floor(86), all.code_floor(80)),
            (Some(900), Some(890), Some(860), None)
        );
        // A B200 runs the compute_80 PTX of this set and may pick the sm_90 plan.
        assert_eq!(ArchSet::parse("80,90a").unwrap().code_floor(90), None);
    }
}
