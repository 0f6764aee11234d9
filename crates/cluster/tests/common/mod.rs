//! What every one-cluster test binary of this crate shares: its watchdog.
//! A libtest harness has no hook after its last test, so each binary runs
//! its cases itself (harness = false) around one `LocalCluster`.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A thread that, when the case named in the cell has run over `limit`,
/// kills this process's redis-server children, removes their directories
/// and exits: a hung case must not leave the cluster behind, and `Drop`
/// cannot run while the case holds it.
pub fn watchdog(limit: Duration) -> Arc<Mutex<Option<(&'static str, Instant)>>> {
    let cell: Arc<Mutex<Option<(&'static str, Instant)>>> = Arc::default();
    let seen = cell.clone();
    std::thread::spawn(move || {
        loop {
            std::thread::sleep(Duration::from_millis(200));
            let Some((name, since)) = *seen.lock().unwrap() else {
                continue;
            };
            if since.elapsed() > limit {
                eprintln!("test {name} hung for {limit:?}: stopping the cluster");
                for pid in redis_children() {
                    let dir = std::fs::read_link(format!("/proc/{pid}/cwd"));
                    let _ = std::process::Command::new("kill")
                        .arg("-9")
                        .arg(pid.to_string())
                        .status();
                    if let Ok(d) = dir {
                        let _ = std::fs::remove_dir_all(d);
                    }
                }
                println!("test {name} ... FAILED (hung)");
                println!("0 passed, 1 failed");
                std::process::exit(1);
            }
        }
    });
    cell
}

/// The redis-server processes this process started, from /proc.
fn redis_children() -> Vec<u32> {
    let mut pids = Vec::new();
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return pids;
    };
    for t in tasks.flatten() {
        let children = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
        for pid in children
            .split_whitespace()
            .filter_map(|p| p.parse::<u32>().ok())
        {
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            if String::from_utf8_lossy(&cmd).contains("redis-server") {
                pids.push(pid);
            }
        }
    }
    pids
}
