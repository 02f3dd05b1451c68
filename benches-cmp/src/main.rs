//! Arbor's durable AddByPath beside two other designs, in one run, on the
//! same workload (`workload.rs`): pilorama's key layout re-created on redb
//! (durable, same batches) and Loro's movable tree in memory. Arbor runs
//! durable on its write-ahead log (the reference row), durable with a
//! redb commit per batch, and with non-durable commits, which shows what
//! durability costs. Prints ops/s, CPU microseconds per op, KiB written
//! per commit and bytes per op (database and log), fsyncs per second and
//! the checkpoints (count x mean time of the batch that made each); the
//! last column is each side's ops/s over Arbor's in the same round.
//!
//!   cargo run --release -- [--ops N] [--batch B] [--rounds R]
//!   cargo run --release -- --crash-replay [--ops N] [--batch B]
//!
//! `--crash-replay` times the open of a forest after a crash instead
//! (`crash_replay.rs`).
//!
//! Rounds run the three sides one after the other, so that a slower
//! minute on a shared machine shows as spread between rounds rather than
//! as a difference between sides.

mod arbor_side;
mod crash_replay;
mod loro_side;
mod measure;
mod pilorama;
mod workload;

struct Args {
    ops: usize,
    batch: usize,
    rounds: usize,
    crash_replay: bool,
}

fn parse_args() -> Args {
    let mut args = Args {
        ops: 100_000,
        batch: 100,
        rounds: 2,
        crash_replay: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = |name: &str| -> usize {
            let v = it.next().unwrap_or_else(|| panic!("{name} needs a value"));
            v.parse().unwrap_or_else(|e| panic!("{name} {v:?}: {e}"))
        };
        match flag.as_str() {
            "--ops" => args.ops = value("--ops"),
            "--batch" => args.batch = value("--batch"),
            "--rounds" => args.rounds = value("--rounds"),
            "--crash-replay" => args.crash_replay = true,
            other => {
                panic!("unknown flag {other} (--ops N, --batch B, --rounds R, --crash-replay)")
            }
        }
    }
    assert!(args.ops >= 1 && args.batch >= 1 && args.rounds >= 1);
    args
}

fn main() {
    let args = parse_args();
    let objects = workload::objects(args.ops);
    if args.crash_replay {
        crash_replay::child(&objects, args.batch);
        crash_replay::run(args.ops, args.batch);
        return;
    }
    println!(
        "ops={} batch={} rounds={} (AddByPath, 7 meta fields, 2-3 directories)",
        args.ops, args.batch, args.rounds
    );
    measure::print_header();
    for _ in 0..args.rounds {
        let arbor = arbor_side::run(&objects, args.batch, arbor_side::Mode::Wal);
        let reference = arbor.ops_per_s();
        arbor.print(reference);
        arbor_side::run(&objects, args.batch, arbor_side::Mode::PerBatch).print(reference);
        arbor_side::run(&objects, args.batch, arbor_side::Mode::NotDurable).print(reference);
        pilorama::run(&objects, args.batch).print(reference);
        loro_side::run(&objects, args.batch).print(reference);
    }
}
