//! Hardware limits the scheduler plans against. Published figures; nothing here is measured.

/// One GPU architecture's budget.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Arch {
    /// `sm_80`, `sm_90`.
    pub name: &'static str,
    /// Streaming multiprocessors (A100: 108; H100/H200: 132).
    pub sms: u32,
    /// Shared memory one block may use after opting in, in bytes.
    pub smem_per_block: u64,
    /// Shared memory per SM, in bytes (bounds blocks per SM).
    pub smem_per_sm: u64,
    /// 32-bit registers per SM.
    pub regs_per_sm: u32,
    /// Most threads resident per SM.
    pub threads_per_sm: u32,
    /// Dense f16 tensor-core peak through `mma.sync`, FLOP/s.
    pub mma_flops: f64,
    /// f32 SIMT peak, FLOP/s.
    pub simt_flops: f64,
    /// DRAM bandwidth, bytes/s.
    pub dram_bandwidth: f64,
    /// Shared-memory bandwidth of all SMs together, bytes/s: 128 bytes per cycle per SM at the
    /// boost clock. ldmatrix, cp.async writes and staging stores all draw on it.
    pub smem_bandwidth: f64,
    /// The SM clock, Hz: what instruction issue counts in (four schedulers per SM, each
    /// issuing one warp instruction per cycle).
    pub clock_hz: f64,
    /// The latency of a DRAM read under load, seconds: with two tiles in flight a block's
    /// loop cannot turn faster than one iteration per half of it (Little's law).
    pub dram_latency: f64,
    /// The most DRAM bandwidth one SM streams on its own, bytes/s. A model constant, not a
    /// measurement: about 1.3 times its even share, so a grid that leaves SMs idle leaves
    /// bandwidth unused, as it does on the hardware (a few SMs cannot keep enough requests in
    /// flight to saturate the memory system).
    pub sm_dram_bandwidth: f64,
    /// L2 cache bytes: a tile many blocks read (a decode's activations, a prefill's keys) comes
    /// from DRAM once while the tensor fits in it, and from L2 for every other block.
    pub l2_bytes: u64,
}

/// A100-SXM4 (sm_80): 164 KiB of opt-in shared memory per SM, 163 KiB per block.
pub const SM80: Arch = Arch {
    name: "sm_80",
    sms: 108,
    smem_per_block: 166_912,
    smem_per_sm: 167_936,
    regs_per_sm: 65_536,
    threads_per_sm: 2048,
    mma_flops: 312e12,
    simt_flops: 19.5e12,
    dram_bandwidth: 2.0e12,
    // 108 SMs × 128 B × 1.41 GHz.
    smem_bandwidth: 19.5e12,
    clock_hz: 1.41e9,
    dram_latency: 6e-7,
    // 1.3 × 2.0 TB/s ÷ 108.
    sm_dram_bandwidth: 24e9,
    l2_bytes: 40 << 20,
};

/// H200 (sm_90) running the sm_80 instruction set (mma.sync, cp.async): 227 KiB per block.
pub const SM90: Arch = Arch {
    name: "sm_90",
    sms: 132,
    smem_per_block: 232_448,
    smem_per_sm: 233_472,
    regs_per_sm: 65_536,
    threads_per_sm: 2048,
    // mma.sync reaches roughly FA2-level throughput on Hopper, not the wgmma peak.
    mma_flops: 500e12,
    simt_flops: 60e12,
    dram_bandwidth: 4.8e12,
    // 132 SMs × 128 B × 1.98 GHz.
    smem_bandwidth: 33.4e12,
    clock_hz: 1.98e9,
    dram_latency: 6e-7,
    // 1.3 × 4.8 TB/s ÷ 132.
    sm_dram_bandwidth: 47e9,
    l2_bytes: 50 << 20,
};

/// What one plan is made for: the limits its kernels must fit on every GPU of the set, and
/// the GPUs its candidates are timed on. A plan runs on all of them, so a candidate is ranked
/// by the mean of its estimates on each (its waves counted on each one's SMs), not on a
/// composite GPU with the fewest SMs of one and the bandwidth of another: a split count sized
/// for an A100's 108 SMs leaves a fifth of an H200 idle.
#[derive(Clone, Debug, PartialEq)]
pub struct Targets {
    /// The smallest of each limit ([`common`]).
    pub fit: Arch,
    /// Each GPU of the set.
    pub gpus: Vec<Arch>,
}

impl Targets {
    /// The targets of a set of budgets (at least one).
    pub fn new(archs: &[Arch]) -> Targets {
        Targets { fit: common(archs), gpus: archs.to_vec() }
    }
}

/// The architecture a single generated kernel must fit everywhere: the smaller of each limit,
/// so one plan runs on every target of the default fatbin (sm_80 and sm_90).
pub fn common(archs: &[Arch]) -> Arch {
    let mut a = archs[0];
    for b in &archs[1..] {
        a.smem_per_block = a.smem_per_block.min(b.smem_per_block);
        a.smem_per_sm = a.smem_per_sm.min(b.smem_per_sm);
        a.sms = a.sms.min(b.sms);
        a.mma_flops = a.mma_flops.min(b.mma_flops);
        a.simt_flops = a.simt_flops.min(b.simt_flops);
        a.dram_bandwidth = a.dram_bandwidth.min(b.dram_bandwidth);
        a.smem_bandwidth = a.smem_bandwidth.min(b.smem_bandwidth);
        a.clock_hz = a.clock_hz.min(b.clock_hz);
        a.dram_latency = a.dram_latency.max(b.dram_latency);
        a.sm_dram_bandwidth = a.sm_dram_bandwidth.min(b.sm_dram_bandwidth);
        a.l2_bytes = a.l2_bytes.min(b.l2_bytes);
    }
    a
}
