//! The number half of the copy's system-call filter, as a binary search
//! (README, "The fence"). `seccompiler` compares a call's number with each
//! listed number in turn: its program for the allow list was 1,522
//! instructions, and on install the kernel runs a new filter once for every
//! call number, to learn which calls it always allows (the cache it keeps
//! since Linux 5.11): 0.7–0.9 ms of every copy's start here, for that one
//! filter. Here the numbers are cut into ranges with one answer each, and
//! the program searches their bounds: about twice as many instructions as
//! ranges, and no call compared more than about ten times. The calls whose
//! arguments are checked stay in `seccompiler`'s filter (`seccomp.rs`).

use seccompiler::sock_filter;

/// BPF_LD | BPF_W | BPF_ABS.
const LD_W_ABS: u16 = 0x20;
/// BPF_JMP | BPF_JA.
const JA: u16 = 0x05;
/// BPF_JMP | BPF_JEQ | BPF_K.
const JEQ_K: u16 = 0x15;
/// BPF_JMP | BPF_JGE | BPF_K.
const JGE_K: u16 = 0x35;
/// BPF_RET | BPF_K.
pub(super) const RET_K: u16 = 0x06;
/// Where `struct seccomp_data` holds the call's number and architecture.
const NR: u32 = 0;
/// See [`NR`].
const ARCH: u32 = 4;

/// x32 calls on x86_64 carry this bit in their number.
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

/// The ranges of call numbers `0..=newest` with the answer `answer` gives
/// each, and `above` for every number after: `(first number, answer)`, in
/// order, no two neighbours with the same answer.
pub fn ranges(answer: impl Fn(u32) -> u32, newest: u32, above: u32) -> Vec<(u32, u32)> {
    let mut out: Vec<(u32, u32)> = Vec::new();
    for (nr, a) in (0..=newest).map(|nr| (nr, answer(nr))).chain([(newest + 1, above)]) {
        if out.last().is_none_or(|&(_, last)| last != a) {
            out.push((nr, a));
        }
    }
    out
}

/// The whole program: a call of another architecture than `arch` gets
/// `refused`, and so does an x32 number when `x32` (x86_64); every other
/// call the answer of its number's range in `ranges` (from [`ranges`]).
pub fn program(ranges: &[(u32, u32)], arch: u32, refused: u32, x32: bool) -> Vec<sock_filter> {
    let op = |code: u16, jt: u8, jf: u8, k: u32| sock_filter { code, jt, jf, k };
    let mut out = vec![op(LD_W_ABS, 0, 0, ARCH), op(JEQ_K, 1, 0, arch), op(RET_K, 0, 0, refused)];
    out.extend(number_loaded(refused, x32));
    out.extend(search(ranges));
    out
}

/// What follows an architecture check: the call's number loaded, and an
/// x32 number refused with `refused` when `x32` (x86_64), before any
/// number is compared. (`seccomp.rs` puts it into `seccompiler`'s program.)
pub fn number_loaded(refused: u32, x32: bool) -> Vec<sock_filter> {
    let op = |code: u16, jt: u8, jf: u8, k: u32| sock_filter { code, jt, jf, k };
    let mut out = vec![op(LD_W_ABS, 0, 0, NR)];
    if x32 {
        out.extend([op(JGE_K, 0, 1, X32_SYSCALL_BIT), op(RET_K, 0, 0, refused)]);
    }
    out
}

/// Answers the number in the accumulator by halving `ranges` (not empty):
/// a jump past the lower half when the number is at or above the middle
/// range's first, the lower half, the upper half. A lower half longer than
/// a conditional jump reaches (255) is passed with an unconditional one.
fn search(ranges: &[(u32, u32)]) -> Vec<sock_filter> {
    let op = |code: u16, jt: u8, jf: u8, k: u32| sock_filter { code, jt, jf, k };
    if let [(_, answer)] = ranges {
        return vec![op(RET_K, 0, 0, *answer)];
    }
    let mid = ranges.len() / 2;
    let (lower, upper) = (search(&ranges[..mid]), search(&ranges[mid..]));
    let bound = ranges[mid].0;
    let mut out = Vec::with_capacity(lower.len() + upper.len() + 2);
    match u8::try_from(lower.len()) {
        Ok(past) => out.push(op(JGE_K, past, 0, bound)),
        Err(_) => out.extend([op(JGE_K, 0, 1, bound), op(JA, 0, 0, lower.len() as u32)]),
    }
    out.extend(lower);
    out.extend(upper);
    out
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// Runs `program` on a call the way the kernel does (only the
    /// instructions these programs use); returns its answer and how many
    /// comparisons it made.
    pub(in crate::launcher) fn run(program: &[sock_filter], arch: u32, nr: u32) -> (u32, usize) {
        let (mut pc, mut acc, mut compared) = (0usize, 0u32, 0usize);
        loop {
            let i = &program[pc];
            pc += 1;
            match i.code {
                LD_W_ABS => acc = if i.k == ARCH { arch } else { nr },
                RET_K => return (i.k, compared),
                JA => pc += i.k as usize,
                JEQ_K | JGE_K => {
                    compared += 1;
                    let yes = if i.code == JEQ_K { acc == i.k } else { acc >= i.k };
                    pc += usize::from(if yes { i.jt } else { i.jf });
                }
                other => panic!("instruction {other:#x} is not one this program uses"),
            }
        }
    }

    const ALLOW: u32 = 0x7fff_0000;
    const EPERM: u32 = 0x0005_0001;
    const ENOSYS: u32 = 0x0005_0026;

    #[test]
    fn every_number_gets_its_answer_in_a_few_comparisons() {
        // Scattered answers, many ranges: every third number allowed, 7s refused otherwise.
        let answer = |nr: u32| match nr {
            _ if nr % 3 == 0 => ALLOW,
            _ if nr % 7 == 0 => ENOSYS,
            _ => EPERM,
        };
        let r = ranges(answer, 600, ENOSYS);
        assert!(r.len() > 300, "enough ranges that some lower half is out of a jump's reach: {}", r.len());
        let p = program(&r, 0xC000_003E, EPERM, true);
        for nr in 0..=700 {
            let want = if nr <= 600 { answer(nr) } else { ENOSYS };
            let (got, compared) = run(&p, 0xC000_003E, nr);
            assert_eq!(got, want, "call {nr}");
            assert!(compared <= 2 + 11, "call {nr}: {compared} comparisons");
        }
        assert_eq!(run(&p, 0xC000_003E, X32_SYSCALL_BIT | 3).0, EPERM, "an x32 number");
        assert_eq!(run(&p, 0x4000_0003, 3).0, EPERM, "another architecture");
        assert_eq!(run(&program(&r, 0xC000_00B7, EPERM, false), 0xC000_00B7, X32_SYSCALL_BIT | 3).0, ENOSYS, "no x32 check asked");
    }

    #[test]
    fn ranges_merge_neighbours_with_one_answer() {
        let r = ranges(|nr| if (3..6).contains(&nr) { ALLOW } else { EPERM }, 9, ENOSYS);
        assert_eq!(r, [(0, EPERM), (3, ALLOW), (6, EPERM), (10, ENOSYS)]);
        assert_eq!(search(&[(0, ALLOW)]).len(), 1);
    }
}
