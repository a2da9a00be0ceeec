//! Logging is the application's choice: the library only emits `tracing`
//! events and installs no global subscriber, so a framework that sets its
//! own after creating communicators (and after a handled failure) keeps it.
//! (`tracing_subscriber`'s `init` panics when one is already set.) Its own
//! test binary, so no other test's global state is in the way.

mod common;
use common::*;
use oxccl::prelude::*;

#[test]
fn an_application_sets_its_own_subscriber_after_using_oxccl() {
    with_ranks(2, test_config(), |c| {
        let mut v = [1f32; 4];
        c.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap();
        assert_eq!(v, [2.0; 4]);
        // A handled failure (the library logs it as an event, nothing more).
        let e = c.broadcast_in_place(&mut v, 7).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
    });
    // And through `from_env`, as a launcher starts a (one-rank) job.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    for (k, v) in [
        ("RANK", "0".to_string()),
        ("WORLD_SIZE", "1".into()),
        ("MASTER_ADDR", "127.0.0.1".into()),
        ("MASTER_PORT", port.to_string()),
        ("OXCCL_SOCKET_IFNAME", "lo".into()),
    ] {
        std::env::set_var(k, v);
    }
    let world = Communicator::from_env().unwrap();
    world.barrier().unwrap();
    assert!(
        !tracing::dispatcher::has_been_set(),
        "the library installed a global tracing subscriber"
    );
    tracing_subscriber::fmt().with_test_writer().init();
    assert!(tracing::dispatcher::has_been_set());
}
