use super::{cpu_worker_runs, CpuWorkers};

fn run(cpu: usize, first: usize, count: usize) -> CpuWorkers {
    CpuWorkers { cpu, first, count }
}

#[test]
fn each_cpu_gets_its_consecutive_workers() {
    let cpus = [0, 0, 0, 1, 1, 1];
    let runs = cpu_worker_runs(&cpus, &[true; 6]);
    assert_eq!(runs, vec![run(0, 0, 3), run(1, 3, 3)]);
    let one_each = cpu_worker_runs(&[4, 7], &[true, true]);
    assert_eq!(one_each, vec![run(4, 0, 1), run(7, 1, 1)]);
}

#[test]
fn a_closed_worker_leaves_the_longest_live_run() {
    let cpus = [0, 0, 0, 1, 1, 1];
    let runs = cpu_worker_runs(&cpus, &[true, false, true, true, true, false]);
    assert_eq!(runs, vec![run(0, 0, 1), run(1, 3, 2)]);
    let none_left = cpu_worker_runs(&cpus, &[false, false, false, true, true, true]);
    assert_eq!(none_left, vec![run(1, 3, 3)]);
}
