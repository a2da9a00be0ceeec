//! A self-test of every collective with exact-valued data: every dtype x
//! op x count, in place and out of place, each element compared with `==`
//! against an exact reference. Used by the test suite (threads as ranks)
//! and by `oxccl-selftest matrix` (processes under a launcher); useful to
//! check an installation the way nccl-tests' `-c 1` does.

use crate::{bf16, f16, with_dtype, Communicator, DataType, Element, ReduceOp};

#[cfg(feature = "cuda")]
mod device;
mod registered;
#[cfg(feature = "cuda")]
pub use device::{run_device_matrix, run_device_shared_matrix};
pub use registered::{run_registered, DirectFrom};

fn err(e: crate::Error) -> String {
    e.to_string()
}

/// Test element: small integers convert exactly into every type.
pub trait TestElem: Element {
    fn from_i(v: i64) -> Self;
    /// `sum / n` the way the library's Avg finishes (trunc for ints).
    fn avg(sum: i64, n: usize) -> Self;
    fn same(a: Self, b: Self) -> bool {
        a == b
    }
}

macro_rules! int_elem {
    ($($t:ty),*) => {$(impl TestElem for $t {
        fn from_i(v: i64) -> Self { v as $t }
        fn avg(sum: i64, n: usize) -> Self { (sum as $t as i128 / n as i128) as $t }
    })*};
}
int_elem!(i8, u8, i32, u32, i64, u64);
impl TestElem for f32 {
    fn from_i(v: i64) -> Self {
        v as f32
    }
    fn avg(sum: i64, n: usize) -> Self {
        sum as f32 / n as f32
    }
}
impl TestElem for f64 {
    fn from_i(v: i64) -> Self {
        v as f64
    }
    fn avg(sum: i64, n: usize) -> Self {
        sum as f64 / n as f64
    }
}
impl TestElem for f16 {
    fn from_i(v: i64) -> Self {
        f16::from_f32(v as f32)
    }
    fn avg(sum: i64, n: usize) -> Self {
        f16::from_f32(sum as f32 / n as f32)
    }
}
impl TestElem for bf16 {
    fn from_i(v: i64) -> Self {
        bf16::from_f32(v as f32)
    }
    fn avg(sum: i64, n: usize) -> Self {
        bf16::from_f32(sum as f32 / n as f32)
    }
}

/// Rank `r`'s value at element `i` for operator `op`: chosen so every
/// reduction is exact in every type (sums <= 3*8, products of 1s and 2s).
pub fn value(op: ReduceOp, r: usize, i: usize) -> i64 {
    match op {
        ReduceOp::Sum | ReduceOp::Avg => ((r + i) % 4) as i64,
        ReduceOp::Prod => 1 + ((r + i) % 2) as i64,
        ReduceOp::Min | ReduceOp::Max => ((r * 7 + i * 3) % 11) as i64,
    }
}

/// The exact reduction over `n` ranks of element `i` (in i64, wrapping
/// happens in the conversion to the element type like in the library).
pub fn expected<T: TestElem>(op: ReduceOp, n: usize, i: usize) -> T {
    let vals = (0..n).map(|r| value(op, r, i));
    match op {
        ReduceOp::Sum => T::from_i(vals.sum()),
        ReduceOp::Avg => T::avg(vals.sum(), n),
        ReduceOp::Prod => T::from_i(vals.product()),
        ReduceOp::Min => T::from_i(vals.min().unwrap()),
        ReduceOp::Max => T::from_i(vals.max().unwrap()),
    }
}

/// Data of rank `r`, `len` elements starting at global index `base`.
pub fn data<T: TestElem>(op: ReduceOp, r: usize, base: usize, len: usize) -> Vec<T> {
    (base..base + len)
        .map(|i| T::from_i(value(op, r, i)))
        .collect()
}

/// First mismatch, formatted, or None.
pub fn first_diff<T: TestElem>(got: &[T], want: impl Fn(usize) -> T) -> Option<String> {
    got.iter()
        .enumerate()
        .find(|(i, g)| !T::same(**g, want(*i)))
        .map(|(i, g)| format!("element {i}: got {g:?}, want {:?}", want(i)))
}

/// The counts the matrix uses for `n` ranks: 0, 1, 7, n-1, n+1, 1 000 003.
pub fn standard_counts(n: usize) -> Vec<usize> {
    let mut v = vec![0, 1, 7, n - 1, n + 1, 1_000_003];
    v.sort();
    v.dedup();
    v
}

/// For collectives whose count is per rank (all_gather, reduce_scatter,
/// all_to_all), large counts are divided by `n` so the total stays near
/// the requested size (and still not divisible by `n`).
fn per_rank(count: usize, n: usize) -> usize {
    if count > 1000 {
        count / n
    } else {
        count
    }
}

/// A call of the matrix or the soak test.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Case {
    AllReduce,
    Reduce,
    ReduceScatter,
    Broadcast,
    AllGather,
    AllToAll,
    /// Send to rank+1, receive from rank-1 (`send_recv`).
    Shift,
    Barrier,
}

impl Case {
    /// Every case.
    pub const ALL: [Case; 8] = [
        Case::AllReduce,
        Case::Reduce,
        Case::ReduceScatter,
        Case::Broadcast,
        Case::AllGather,
        Case::AllToAll,
        Case::Shift,
        Case::Barrier,
    ];

    /// The collectives with a send and a receive buffer (what memory other
    /// than host slices is tested with: not send/recv, not barrier).
    pub const BUFFERS: [Case; 6] = [
        Case::AllReduce,
        Case::Reduce,
        Case::ReduceScatter,
        Case::Broadcast,
        Case::AllGather,
        Case::AllToAll,
    ];

    /// The collective kind of a [`Case::BUFFERS`] case (send/recv and
    /// barrier map to `P2p` and `Barrier`).
    pub fn kind(self) -> crate::Kind {
        use crate::Kind;
        match self {
            Case::AllReduce => Kind::AllReduce,
            Case::Reduce => Kind::Reduce,
            Case::ReduceScatter => Kind::ReduceScatter,
            Case::Broadcast => Kind::Broadcast,
            Case::AllGather => Kind::AllGather,
            Case::AllToAll => Kind::AllToAll,
            Case::Shift => Kind::P2p,
            Case::Barrier => Kind::Barrier,
        }
    }

    /// Whether the reduction operator matters.
    pub fn reduces(self) -> bool {
        matches!(self, Case::AllReduce | Case::Reduce | Case::ReduceScatter)
    }
}

/// One call of the matrix: which collective, operator, NCCL-style count
/// (per rank for the segmented collectives), root, in place or not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Call {
    pub case: Case,
    pub op: ReduceOp,
    pub count: usize,
    pub root: usize,
    pub in_place: bool,
}

impl Call {
    /// The operator the call runs (`Sum` where none applies).
    pub fn op(&self) -> ReduceOp {
        if self.case.reduces() {
            self.op
        } else {
            ReduceOp::Sum
        }
    }

    /// How failures name it: `rank 1/4 f32 AllReduce sum count 7 root 0 in_place false`.
    pub fn describe(&self, dtype: DataType, r: usize, n: usize) -> String {
        format!(
            "rank {r}/{n} {dtype} {:?} {} count {} root {} in_place {}",
            self.case,
            self.op(),
            self.count,
            self.root,
            self.in_place
        )
    }
}

/// One collective's buffers before the call, as every path of the matrix
/// fills them: `send` (`None` in place) and `recv`.
#[derive(Debug)]
pub struct Prepared<T> {
    pub send: Option<Vec<T>>,
    pub recv: Vec<T>,
}

/// The buffers of rank `r` of `n` for `case` (not `Shift` or `Barrier`,
/// which have their own calls): exact-valued data, the receive buffer as
/// the call expects it (in place: holding this rank's contribution).
pub fn prepare<T: TestElem>(call: &Call, r: usize, n: usize) -> Prepared<T> {
    let Call {
        case,
        count,
        root,
        in_place,
        ..
    } = *call;
    let op = call.op();
    let (send, recv): (Vec<T>, Vec<T>) = match case {
        Case::AllReduce => {
            let input = data(op, r, 0, count);
            (input.clone(), input)
        }
        Case::Reduce => {
            let input: Vec<T> = data(op, r, 0, count);
            let out = match in_place || r == root {
                true => input.clone(),
                false => Vec::new(),
            };
            (input, out)
        }
        Case::ReduceScatter => {
            let full: Vec<T> = data(op, r, 0, n * count);
            match in_place {
                true => (Vec::new(), full),
                false => (full, vec![T::default(); count]),
            }
        }
        Case::Broadcast => {
            let input: Vec<T> = data(op, r, 0, count);
            match (in_place, r == root) {
                (true, _) => (Vec::new(), input),
                (false, true) => (input, vec![T::default(); count]),
                (false, false) => (Vec::new(), vec![T::default(); count]),
            }
        }
        Case::AllGather => {
            let mine: Vec<T> = data(op, r, 0, count);
            let mut out = vec![T::default(); n * count];
            if in_place {
                out[r * count..(r + 1) * count].copy_from_slice(&mine);
            }
            (mine, out)
        }
        Case::AllToAll => {
            let send: Vec<T> = data(op, r, 0, n * count);
            (send.clone(), send)
        }
        Case::Shift | Case::Barrier => (Vec::new(), Vec::new()),
    };
    Prepared {
        send: (!in_place).then_some(send),
        recv,
    }
}

/// The first element of `got` (rank `r`'s receive buffer after `case`)
/// that differs from the exact result, formatted; `before` is what
/// [`prepare`] gave.
pub fn verify<T: TestElem>(
    call: &Call,
    r: usize,
    n: usize,
    before: &Prepared<T>,
    got: &[T],
) -> Option<String> {
    let Call {
        case,
        count,
        root,
        in_place,
        ..
    } = *call;
    let op = call.op();
    let v = |rank: usize, i: usize| T::from_i(value(op, rank, i));
    match case {
        Case::AllReduce => first_diff(got, |i| expected(op, n, i)),
        Case::Reduce if r == root => first_diff(got, |i| expected(op, n, i)),
        // Non-roots keep their buffer in place; out of place they pass none.
        Case::Reduce if in_place => first_diff(got, |i| before.recv[i]),
        Case::Reduce => None,
        Case::ReduceScatter if in_place => first_diff(got, |i| {
            if i / count.max(1) == r && count > 0 {
                expected(op, n, i)
            } else {
                before.recv[i]
            }
        }),
        Case::ReduceScatter => first_diff(got, |i| expected(op, n, r * count + i)),
        Case::Broadcast => first_diff(got, |i| v(root, i)),
        Case::AllGather => first_diff(got, |i| v(i / count, i % count)),
        Case::AllToAll => first_diff(got, |i| v(i / count, r * count + i % count)),
        Case::Shift => {
            let prev = (r + n - 1) % n;
            first_diff(got, |i| v(prev, i))
        }
        Case::Barrier => None,
    }
}

/// Run one call with exact-valued data and check every element this rank
/// holds afterwards. `count` is the NCCL-style count (per rank for the
/// segmented collectives).
pub fn run_one<T: TestElem>(comm: &Communicator, call: &Call) -> Result<(), String> {
    let (r, n) = (comm.rank(), comm.nranks());
    let Call {
        case,
        count,
        root,
        in_place,
        ..
    } = *call;
    let op = call.op();
    let p = prepare::<T>(call, r, n);
    let mut out = p.recv.clone();
    match (case, &p.send) {
        (Case::AllReduce, None) => comm.all_reduce_in_place(&mut out, op),
        (Case::AllReduce, Some(s)) => comm.all_reduce(s, &mut out, op),
        (Case::Reduce, None) => comm.reduce_in_place(&mut out, op, root),
        (Case::Reduce, Some(s)) => comm.reduce(s, &mut out, op, root),
        (Case::ReduceScatter, None) => comm.reduce_scatter_in_place(&mut out, op),
        (Case::ReduceScatter, Some(s)) => comm.reduce_scatter(s, &mut out, op),
        (Case::Broadcast, None) => comm.broadcast_in_place(&mut out, root),
        (Case::Broadcast, Some(s)) => comm.broadcast(s, &mut out, root),
        (Case::AllGather, None) => comm.all_gather_in_place(&mut out),
        (Case::AllGather, Some(s)) => comm.all_gather(s, &mut out),
        (Case::AllToAll, None) => comm.all_to_all_in_place(&mut out),
        (Case::AllToAll, Some(s)) => comm.all_to_all(s, &mut out),
        (Case::Shift, _) => {
            let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
            let mine: Vec<T> = data(op, r, 0, count);
            out = mine.clone();
            match in_place {
                true => comm.send_recv_replace(&mut out, next, prev),
                false => comm.send_recv(&mine, next, &mut out, prev),
            }
        }
        (Case::Barrier, _) => comm.barrier(),
    }
    .map_err(err)?;
    match verify(call, r, n, &p, &out) {
        Some(d) => {
            let m = format!("{}: {d}", call.describe(T::DTYPE, r, n));
            eprintln!("selftest failure: {m}");
            Err(m)
        }
        None => Ok(()),
    }
}

/// Every call of the matrix for `n` ranks: each count, case, operator
/// (the reducing cases), in and out of place, with a root that moves.
/// `cases` says which cases.
pub fn each_call(
    n: usize,
    counts: &[usize],
    cases: &[Case],
    mut run: impl FnMut(&Call) -> Result<(), String>,
) -> Result<(), String> {
    for &count in counts {
        for &case in cases {
            let ops: &[ReduceOp] = if case.reduces() {
                &ReduceOp::ALL
            } else {
                &[ReduceOp::Sum]
            };
            let c = match case {
                Case::ReduceScatter | Case::AllGather | Case::AllToAll => per_rank(count, n),
                _ => count,
            };
            for (oi, &op) in ops.iter().enumerate() {
                let root = (oi + count) % n;
                for in_place in [false, true] {
                    run(&Call {
                        case,
                        op,
                        count: c,
                        root,
                        in_place,
                    })?;
                }
            }
        }
    }
    Ok(())
}

fn check_type<T: TestElem>(comm: &Communicator, counts: &[usize]) -> Result<(), String> {
    each_call(comm.nranks(), counts, &Case::ALL, |call| {
        run_one::<T>(comm, call)
    })
}

/// A deterministic generator every rank seeds alike, so all ranks draw the
/// same sequence of calls.
#[derive(Debug)]
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// Soak: `calls` random calls (kind, dtype, op, count from 0 to `max_count`
/// weighted toward small, root, in place or not), every result checked
/// exactly. Returns how many calls ran.
pub fn soak(
    comm: &Communicator,
    seed: u64,
    calls: usize,
    max_count: usize,
) -> Result<usize, String> {
    let n = comm.nranks();
    let mut rng = Rng(seed | 1);
    for _ in 0..calls {
        let case = Case::ALL[rng.below(Case::ALL.len())];
        let dtype = DataType::ALL[rng.below(DataType::ALL.len())];
        let op = ReduceOp::ALL[rng.below(ReduceOp::ALL.len())];
        // Half tiny, a third medium, the rest up to the maximum.
        let count = match rng.below(6) {
            0..=2 => rng.below(17),
            3 | 4 => rng.below(4097),
            _ => rng.below(max_count + 1),
        };
        let count = match case {
            Case::ReduceScatter | Case::AllGather | Case::AllToAll => count / n,
            _ => count,
        };
        let root = rng.below(n);
        let in_place = rng.below(2) == 1;
        let call = Call {
            case,
            op,
            count,
            root,
            in_place,
        };
        with_dtype!(dtype, T => run_one::<T>(comm, &call))?;
    }
    Ok(calls)
}

/// Run the whole matrix on `comm` for every dtype; `Err` names the first
/// wrong element (rank, dtype, collective, op, count).
pub fn run_matrix(comm: &Communicator, counts: &[usize]) -> Result<(), String> {
    check_type::<i8>(comm, counts)?;
    check_type::<u8>(comm, counts)?;
    check_type::<i32>(comm, counts)?;
    check_type::<u32>(comm, counts)?;
    check_type::<i64>(comm, counts)?;
    check_type::<u64>(comm, counts)?;
    check_type::<f16>(comm, counts)?;
    check_type::<bf16>(comm, counts)?;
    check_type::<f32>(comm, counts)?;
    check_type::<f64>(comm, counts)?;
    comm.barrier().map_err(err)
}
