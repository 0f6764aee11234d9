//! `memfs volume create|list|status|clean|delete` against a real local Redis
//! Cluster (3 masters, no replicas: administration needs no failover, and
//! the cluster then starts in a few seconds). The cluster is stopped when
//! the test ends, passes or panics (`LocalCluster`'s Drop). And the room a
//! volume's session reports to statfs, which it asks of that cluster.

mod common;

use memfs_cluster::{Volume, VolumeOptions};

#[test]
fn volume_commands_create_list_status_and_delete() {
    let cluster = common::cluster_without_replicas();
    let seeds = cluster.urls();
    // The first seed with its scheme, the others bare, as the issue writes it.
    let spec = format!("{},{}", seeds[0], seeds[1].trim_start_matches("redis://"));
    let volume = |args: &[&str]| {
        let mut all = vec!["volume"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["--cluster", &spec]);
        common::memfs(all)
    };

    let out = common::ok(volume(&["create", "ci.fixtures", "--block-size", "128K"]));
    assert!(
        out.contains("created volume ci.fixtures (128K blocks)"),
        "{out}"
    );
    common::ok(volume(&["create", "scratch"]));

    let err = common::failed(volume(&["create", "scratch"]));
    assert!(err.contains("volume \"scratch\" exists"), "{err}");
    let err = common::failed(volume(&["create", "no/slash"]));
    assert!(err.contains("bad volume name"), "{err}");
    let err = common::failed(volume(&["create", "odd", "--block-size", "3000"]));
    assert!(err.contains("block size 3000"), "{err}");

    assert_eq!(common::ok(volume(&["list"])), "ci.fixtures\nscratch\n");

    let status = common::ok(volume(&["status", "ci.fixtures"]));
    assert!(status.contains("volume:          ci.fixtures"), "{status}");
    assert!(status.contains("block size:      128K"), "{status}");
    assert!(status.contains("live sessions:   0"), "{status}");
    assert!(status.contains("metadata:        slot "), "{status}");
    let err = common::failed(volume(&["status", "missing"]));
    assert!(err.contains("no volume \"missing\""), "{err}");

    // A clean of a volume nothing wrote frees nothing; one with a live
    // session, or of no volume, is a clear error.
    let out = common::ok(volume(&["clean", "scratch"]));
    assert_eq!(
        out,
        "cleaned volume scratch: 0 of 0 data blocks freed (0B); 0 files name 0 blocks\n"
    );
    let err = common::failed(volume(&["clean", "missing"]));
    assert!(err.contains("no volume \"missing\""), "{err}");
    {
        let vol = Volume::open(&seeds, "scratch", &VolumeOptions::default()).unwrap();
        let err = common::failed(volume(&["clean", "scratch"]));
        vol.close().unwrap();
        assert!(
            err.contains("1 live session(s): unmount it everywhere"),
            "{err}"
        );
    }

    let out = common::ok(volume(&["delete", "scratch"]));
    assert!(out.starts_with("deleted volume scratch: "), "{out}");
    assert_eq!(common::ok(volume(&["list"])), "ci.fixtures\n");

    // A session's statfs is the masters' memory, asked over the session's
    // own pool: 3 masters of 256 MiB (`LocalCluster`'s maxmemory), in the
    // volume's 128K blocks. A failed ask would read as 2^50 bytes.
    {
        let vol = Volume::open(&seeds, "ci.fixtures", &VolumeOptions::default()).unwrap();
        let st = vol.statfs();
        vol.close().unwrap();
        assert_eq!(st.frsize, 128 << 10);
        assert_eq!(st.blocks, 3 * (256 << 20) / (128 << 10), "{st:?}");
        assert!(st.bfree > 0 && st.bfree < st.blocks, "{st:?}");
    }

    // A bad --cluster is a clear error, not a panic or a hang.
    let err = common::failed(common::memfs(["volume", "list", "--cluster", "http://x:1"]));
    assert!(err.contains("is not redis://"), "{err}");
    let err = common::failed(common::memfs(["volume", "list", "--cluster", "127.0.0.1"]));
    assert!(err.contains("has no :port"), "{err}");
}
