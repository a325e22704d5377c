//! Static figures of a kernel's machine code: parses the SASS listing `cuobjdump -sass` prints,
//! finds its loops (backward branches), picks the hottest one and counts what it issues.
//!
//! The figures are those of the main-loop benchmark (`cargo bench --bench sass`): instructions
//! and `LDSM` per `HMMA`, the share of integer and predicate work, shared-memory and global
//! bytes per warp, and from them two lower bounds on the cycles an SM spends per `HMMA`: issue
//! (four schedulers, one warp instruction each per cycle) and shared memory (128 bytes per
//! cycle). Both kernels of a comparison run the same `HMMA` and `MUFU` work per attention score,
//! so the difference in instructions per score element is overhead.
//!
//! This is text processing only: no GPU, and the listing comes from any cuobjdump that reads
//! the cubin.

use std::fmt;

/// One instruction of a listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Instr {
    /// The byte address inside the function.
    pub addr: u64,
    /// Whether a guard predicate (`@P0`, `@!UP1`, ...) precedes the opcode.
    pub guarded: bool,
    /// The opcode with its modifiers, such as `LDSM.16.M88.4`.
    pub opcode: String,
    /// The operands, as printed.
    pub operands: String,
}

impl Instr {
    /// The mnemonic without modifiers: `LDSM` for `LDSM.16.M88.4`.
    pub fn mnemonic(&self) -> &str {
        self.opcode.split('.').next().unwrap_or_default()
    }

    /// The target address of a direct branch (`BRA 0x4b0`), if this is one.
    pub fn branch_target(&self) -> Option<u64> {
        if self.mnemonic() != "BRA" {
            return None;
        }
        let t = self.operands.split_whitespace().find(|w| w.starts_with("0x"))?;
        u64::from_str_radix(t.trim_start_matches("0x").trim_end_matches(','), 16).ok()
    }
}

/// One function (kernel) of a listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Function {
    /// The symbol.
    pub name: String,
    /// Its instructions, in address order.
    pub instrs: Vec<Instr>,
}

/// Parses a `cuobjdump -sass` listing into its functions. Lines that are not instructions
/// (headers, encodings, labels) are skipped.
pub fn parse(listing: &str) -> Vec<Function> {
    let mut out: Vec<Function> = Vec::new();
    for line in listing.lines() {
        let line = line.trim();
        if let Some(name) = line.strip_prefix("Function : ") {
            out.push(Function { name: name.trim().to_string(), instrs: Vec::new() });
            continue;
        }
        let (Some(f), Some(instr)) = (out.last_mut(), parse_instr(line)) else { continue };
        f.instrs.push(instr);
    }
    out
}

/// `/*0460*/   @!P0 BRA 0x6f0 ;   /* 0x... */` → an instruction; anything else → `None`.
fn parse_instr(line: &str) -> Option<Instr> {
    let rest = line.strip_prefix("/*")?;
    let (addr, rest) = rest.split_once("*/")?;
    let addr = u64::from_str_radix(addr.trim(), 16).ok()?;
    // The encoding comment follows the terminating semicolon.
    let (body, _) = rest.split_once(';')?;
    let mut words = body.split_whitespace().peekable();
    let guarded = words.peek().is_some_and(|w| w.starts_with('@'));
    if guarded {
        words.next();
    }
    let opcode = words.next()?.to_string();
    if !opcode.chars().next().is_some_and(|c| c.is_ascii_uppercase()) {
        return None;
    }
    let operands = words.collect::<Vec<_>>().join(" ");
    Some(Instr { addr, guarded, opcode, operands })
}

/// A loop: the instructions from a backward branch's target up to the branch itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Loop {
    /// Index of the first instruction.
    pub first: usize,
    /// Index of the backward branch.
    pub last: usize,
}

/// Every loop of `f`: one per backward branch whose target is an instruction of `f`. A branch
/// to itself is not a loop but the trap ptxas puts after the last `EXIT`.
pub fn loops(f: &Function) -> Vec<Loop> {
    let mut out = Vec::new();
    for (last, i) in f.instrs.iter().enumerate() {
        let Some(target) = i.branch_target() else { continue };
        if target >= i.addr {
            continue;
        }
        if let Some(first) = f.instrs.iter().position(|j| j.addr == target) {
            out.push(Loop { first, last });
        }
    }
    out
}

/// What a sequence of instructions issues, by kind. Counts are per warp: one warp
/// instruction each. `NOP`s (alignment padding) are left out of every count.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Every instruction but `NOP`.
    pub total: u64,
    /// Tensor-core products (`HMMA`, `IMMA`, `HGMMA`).
    pub mma: u64,
    /// `LDSM` (ldmatrix).
    pub ldsm: u64,
    /// Integer, address and predicate arithmetic, on both the vector and the uniform datapath.
    pub integer: u64,
    /// Floating-point arithmetic and conversions, `MUFU` excluded.
    pub float: u64,
    /// `MUFU` (exp2, rcp, rsqrt, ...).
    pub mufu: u64,
    /// Shared-memory loads and stores (`LDS`, `STS`, `LDSM`) and `LDGSTS` (cp.async).
    pub smem_ops: u64,
    /// Bytes those move through shared memory, per warp.
    pub smem_bytes: u64,
    /// Global loads, stores, cp.async and atomics.
    pub global_ops: u64,
    /// Bytes those move, per warp.
    pub global_bytes: u64,
    /// Barriers (`BAR`), waits on cp.async groups (`LDGDEPBAR`, `DEPBAR`) and warp syncs.
    pub sync: u64,
    /// Branches and other control flow.
    pub control: u64,
}

/// The bytes one warp instruction moves, from the access width in its opcode (`.128`, `.64`,
/// `.U16`, ...; 32-bit when none is given) and, for `LDSM`, its matrix count.
fn access_bytes(opcode: &str) -> u64 {
    let mods: Vec<&str> = opcode.split('.').skip(1).collect();
    if opcode.starts_with("LDSM") {
        // .M88.4 loads four 8x8 matrices of 16-bit elements: 32 threads × 16 bytes.
        let matrices = match mods.last() {
            Some(&"4") => 4,
            Some(&"2") => 2,
            _ => 1,
        };
        return 128 * matrices;
    }
    let per_thread = if mods.contains(&"128") {
        16
    } else if mods.contains(&"64") {
        8
    } else if mods.iter().any(|m| matches!(*m, "U8" | "S8")) {
        1
    } else if mods.iter().any(|m| matches!(*m, "U16" | "S16")) {
        2
    } else {
        4
    };
    32 * per_thread
}

/// Counts `instrs`.
pub fn count(instrs: &[Instr]) -> Counts {
    let mut c = Counts::default();
    for i in instrs {
        let m = i.mnemonic();
        if m == "NOP" {
            continue;
        }
        c.total += 1;
        match m {
            "HMMA" | "IMMA" | "HGMMA" | "DMMA" => c.mma += 1,
            "LDSM" => {
                c.ldsm += 1;
                c.smem_ops += 1;
                c.smem_bytes += access_bytes(&i.opcode);
            }
            "LDS" | "STS" => {
                c.smem_ops += 1;
                c.smem_bytes += access_bytes(&i.opcode);
            }
            "LDGSTS" => {
                // A cp.async reads global memory and writes shared memory.
                let b = access_bytes(&i.opcode);
                c.smem_ops += 1;
                c.smem_bytes += b;
                c.global_ops += 1;
                c.global_bytes += b;
            }
            "LDG" | "STG" | "RED" | "ATOM" | "ATOMG" | "LD" | "ST" => {
                c.global_ops += 1;
                c.global_bytes += access_bytes(&i.opcode);
            }
            "MUFU" => c.mufu += 1,
            "FFMA" | "FMUL" | "FADD" | "FMNMX" | "FSETP" | "FSEL" | "FSWZADD" | "FCHK" | "HFMA2" | "HADD2"
            | "HMUL2" | "HMNMX2" | "HSETP2" | "F2F" | "F2FP" | "F2I" | "I2F" | "FRND" | "DFMA" | "DADD" | "DMUL" => {
                c.float += 1
            }
            "BAR" | "LDGDEPBAR" | "DEPBAR" | "WARPSYNC" | "MEMBAR" | "BSYNC" | "BSSY" => c.sync += 1,
            "BRA" | "BRX" | "JMP" | "EXIT" | "RET" | "CALL" | "YIELD" | "BPT" => c.control += 1,
            _ if is_integer(m) => c.integer += 1,
            _ => {}
        }
    }
    c
}

/// Integer, address and predicate arithmetic (moves, shuffles and special-register reads are
/// not counted here: they are neither address math nor useful work).
fn is_integer(m: &str) -> bool {
    // The uniform datapath repeats the vector mnemonics with a leading U.
    let v = m.strip_prefix('U').filter(|v| is_vector_integer(v)).unwrap_or(m);
    is_vector_integer(v)
}

fn is_vector_integer(m: &str) -> bool {
    matches!(
        m,
        "IMAD"
            | "IADD3"
            | "IADD"
            | "IADD32I"
            | "IMUL"
            | "VIADD"
            | "VIMNMX"
            | "IMNMX"
            | "IABS"
            | "LOP3"
            | "LOP"
            | "SHF"
            | "SHL"
            | "SHR"
            | "LEA"
            | "ISETP"
            | "ISCADD"
            | "SEL"
            | "PRMT"
            | "POPC"
            | "FLO"
            | "BMSK"
            | "SGXT"
            | "BREV"
            | "P2R"
            | "R2P"
            | "PLOP3"
            | "PSETP"
            | "IDP"
            | "IMNMX3"
    )
}

/// The hottest loop of a function and its figures.
#[derive(Clone, Debug, PartialEq)]
pub struct LoopReport {
    /// The function.
    pub function: String,
    /// Addresses of the loop's first instruction and of its backward branch (`None` when the
    /// function has no loop and the figures are the whole function's).
    pub span: Option<(u64, u64)>,
    /// Its counts, per warp and iteration.
    pub counts: Counts,
    /// Loops inside it. Their bodies are counted once, whatever their trip counts, so with
    /// any the figures are a lower bound on what an iteration issues.
    pub inner: usize,
}

impl LoopReport {
    /// Instructions per tensor-core product.
    pub fn instr_per_mma(&self) -> Option<f64> {
        ratio(self.counts.total, self.counts.mma)
    }

    /// `LDSM` per tensor-core product.
    pub fn ldsm_per_mma(&self) -> Option<f64> {
        ratio(self.counts.ldsm, self.counts.mma)
    }

    /// Integer and predicate instructions as a share of all.
    pub fn integer_share(&self) -> Option<f64> {
        ratio(self.counts.integer, self.counts.total)
    }

    /// Cycles an SM spends issuing per tensor-core product: four schedulers issue one warp
    /// instruction per cycle each.
    pub fn issue_cycles_per_mma(&self) -> Option<f64> {
        self.instr_per_mma().map(|r| r / 4.0)
    }

    /// Cycles of shared-memory bandwidth per tensor-core product (128 bytes per cycle per SM).
    pub fn smem_cycles_per_mma(&self) -> Option<f64> {
        ratio(self.counts.smem_bytes, self.counts.mma).map(|b| b / 128.0)
    }

    /// Instructions per attention score element for a loop whose products are `Q·Kᵀ` and
    /// `P·V` with head dim `d` in `m16n8k16` tiles: per warp and iteration the loop computes
    /// `mma · 2048 / (2 d)` scores, so the ratio is `instr_per_mma · d / 1024`.
    pub fn instr_per_score(&self, d: u64) -> Option<f64> {
        self.instr_per_mma().map(|r| r * d as f64 / 1024.0)
    }

    /// Instructions per 16 bytes of global memory moved, for streaming loops.
    pub fn instr_per_16_global_bytes(&self) -> Option<f64> {
        // Per warp: each thread's 16 bytes are 512 bytes of the warp.
        ratio(self.counts.total * 512, self.counts.global_bytes)
    }
}

fn ratio(a: u64, b: u64) -> Option<f64> {
    (b > 0).then(|| a as f64 / b as f64)
}

/// The hottest loop of `f`: of the innermost loops that issue tensor-core products, the one
/// with the most; without any, of the innermost loops that move global memory, the one that
/// moves the most; without either, the longest loop. Other ties go to the shorter loop. An
/// outer loop holds its inner loops' work (a full-tile loop and its masked remainder, say), so
/// it is not the hottest when one of them qualifies. A function without loops reports its
/// whole body.
pub fn hottest(f: &Function) -> LoopReport {
    let all: Vec<(Loop, Counts)> = loops(f).into_iter().map(|l| (l, count(&f.instrs[l.first..=l.last]))).collect();
    let contains = |a: &Loop, b: &Loop| a != b && a.first <= b.first && b.last <= a.last;
    // The innermost loops that do `work`: none of the loops inside them does any.
    let innermost = |work: fn(&Counts) -> bool| -> Vec<(Loop, Counts)> {
        all.iter().filter(|(l, c)| work(c) && !all.iter().any(|(m, mc)| contains(l, m) && work(mc))).copied().collect()
    };
    let mut candidates = innermost(|c| c.mma > 0);
    if candidates.is_empty() {
        candidates = innermost(|c| c.global_bytes > 0);
    }
    if candidates.is_empty() {
        candidates = all.clone();
    }
    let best = candidates.into_iter().max_by_key(|(l, c)| {
        let streaming = if c.mma == 0 { c.global_bytes } else { 0 };
        let plain = if c.mma == 0 && c.global_bytes == 0 { c.total } else { 0 };
        (c.mma, streaming, plain, std::cmp::Reverse(l.last - l.first))
    });
    match best {
        Some((l, counts)) => LoopReport {
            function: f.name.clone(),
            span: Some((f.instrs[l.first].addr, f.instrs[l.last].addr)),
            counts,
            inner: all.iter().filter(|(m, _)| contains(&l, m)).count(),
        },
        None => LoopReport { function: f.name.clone(), span: None, counts: count(&f.instrs), inner: all.len() },
    }
}

impl fmt::Display for LoopReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.counts;
        match self.span {
            Some((a, b)) => write!(f, "{}: loop {a:#x}..={b:#x}", self.function)?,
            None => write!(f, "{}: no loop", self.function)?,
        }
        write!(f, ", {} instructions, {} mma, {} ldsm, {} integer", c.total, c.mma, c.ldsm, c.integer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A listing written for the test in cuobjdump's format: a prologue, a loop of two
    /// products at 0x0040..=0x00f0, and an exit.
    const LISTING: &str = "
	code for sm_90
		Function : k_main
	.headerflags	@\"EF_CUDA_SM90 EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)\"
        /*0000*/                   LDC R1, c[0x0][0x28] ;                 /* 0x00000a00ff017b82 */
                                                                          /* 0x000ff00000000800 */
        /*0010*/                   S2R R2, SR_TID.X ;                     /* 0x0000000000027919 */
        /*0020*/                   IMAD.SHL.U32 R3, R2, 0x10, RZ ;        /* 0x0000001002037824 */
        /*0030*/                   NOP ;                                  /* 0x0000000000007918 */
        /*0040*/                   LDGSTS.E.BYPASS.128 [R3], desc[UR4][R4.64] ; /* 0x0 */
        /*0050*/                   LDSM.16.M88.4 R8, [R3] ;               /* 0x0 */
        /*0060*/                   LDSM.16.MT88.2 R12, [R3+0x200] ;       /* 0x0 */
        /*0070*/                   HMMA.16816.F32 R16, R8, R12, R16 ;     /* 0x0 */
        /*0080*/                   HMMA.16816.F32 R20, R10, R14, R20 ;    /* 0x0 */
        /*0090*/                   MUFU.EX2 R24, R24 ;                    /* 0x0 */
        /*00a0*/                   FFMA R25, R24, R26, R25 ;              /* 0x0 */
        /*00b0*/                   UIADD3 UR4, UR4, 0x1, URZ ;            /* 0x0 */
        /*00c0*/                   ISETP.GE.AND P0, PT, R2, 0x3, PT ;     /* 0x0 */
        /*00d0*/                   STS.64 [R3], R24 ;                     /* 0x0 */
        /*00e0*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;          /* 0x0 */
        /*00f0*/              @!P0 BRA 0x40 ;                             /* 0x0 */
        /*0100*/                   STG.E.128 desc[UR4][R6.64], R16 ;      /* 0x0 */
        /*0110*/                   EXIT ;                                 /* 0x0 */
.L_x_0:
        /*0120*/                   BRA 0x120;                             /* 0x0 */
		Function : k_copy
        /*0000*/                   LDG.E.128 R4, desc[UR4][R2.64] ;       /* 0x0 */
        /*0010*/                   STG.E.128 desc[UR4][R8.64], R4 ;       /* 0x0 */
        /*0020*/                   EXIT ;                                 /* 0x0 */
";

    #[test]
    fn a_listing_parses_into_functions_and_instructions() {
        let fs = parse(LISTING);
        assert_eq!(fs.iter().map(|f| f.name.as_str()).collect::<Vec<_>>(), ["k_main", "k_copy"]);
        assert_eq!(fs[0].instrs.len(), 19);
        let bra = &fs[0].instrs[15];
        assert_eq!((bra.addr, bra.guarded, bra.mnemonic(), bra.branch_target()), (0xf0, true, "BRA", Some(0x40)));
        assert_eq!(fs[0].instrs[5].opcode, "LDSM.16.M88.4");
    }

    #[test]
    fn the_hottest_loop_is_found_and_counted() {
        let fs = parse(LISTING);
        // The backward branch at 0xf0 is a loop; the branch to itself at 0x120 is not.
        assert_eq!(loops(&fs[0]), [Loop { first: 4, last: 15 }]);
        let r = hottest(&fs[0]);
        assert_eq!(r.span, Some((0x40, 0xf0)));
        let c = r.counts;
        assert_eq!((c.total, c.mma, c.ldsm, c.mufu, c.float), (12, 2, 2, 1, 1));
        assert_eq!((c.integer, c.sync, c.control), (2, 1, 1));
        // 512 (cp.async) + 512 (x4) + 256 (x2) + 256 (STS.64) bytes of shared memory.
        assert_eq!((c.smem_ops, c.smem_bytes), (4, 1536));
        assert_eq!((c.global_ops, c.global_bytes), (1, 512));
        assert_eq!(r.instr_per_mma(), Some(6.0));
        assert_eq!(r.ldsm_per_mma(), Some(1.0));
        assert_eq!(r.issue_cycles_per_mma(), Some(1.5));
        assert_eq!(r.smem_cycles_per_mma(), Some(6.0));
        assert_eq!(r.instr_per_score(128), Some(0.75));
    }

    #[test]
    fn a_function_without_loops_reports_its_body() {
        let fs = parse(LISTING);
        let r = hottest(&fs[1]);
        assert_eq!(r.span, None);
        assert_eq!((r.counts.total, r.counts.global_ops, r.counts.global_bytes), (3, 2, 1024));
        assert_eq!(r.instr_per_mma(), None);
        assert_eq!(r.instr_per_16_global_bytes(), Some(1.5));
    }

    #[test]
    fn an_outer_loop_never_hides_its_inner_loops() {
        // An outer loop (0x00..=0x60) around two inner loops of one product each: the outer
        // one holds both products, but the hottest is the inner loop, and of the two the
        // shorter.
        let listing = "
		Function : nest
        /*0000*/                   HMMA.16816.F32 R0, R4, R8, R0 ;
        /*0010*/                   IADD3 R1, R1, 0x1, RZ ;
        /*0020*/              @P0 BRA 0x0 ;
        /*0030*/                   HMMA.16816.F32 R0, R4, R8, R0 ;
        /*0040*/              @P1 BRA 0x30 ;
        /*0050*/                   IADD3 R2, R2, 0x1, RZ ;
        /*0060*/              @P2 BRA 0x0 ;
        /*0070*/                   EXIT ;
";
        let fs = parse(listing);
        assert_eq!(loops(&fs[0]).len(), 3);
        let r = hottest(&fs[0]);
        assert_eq!(r.span, Some((0x30, 0x40)));
        assert_eq!((r.counts.total, r.counts.mma, r.inner), (2, 1, 0));
    }

    #[test]
    fn access_widths_follow_the_opcode() {
        assert_eq!(access_bytes("LDS.U16"), 64);
        assert_eq!(access_bytes("LDS"), 128);
        assert_eq!(access_bytes("STS.128"), 512);
        assert_eq!(access_bytes("LDSM.16.M88"), 128);
        assert_eq!(access_bytes("LDG.E.64.CONSTANT"), 256);
    }
}
