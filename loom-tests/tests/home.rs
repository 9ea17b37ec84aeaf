//! Model 16: a core's home of sleeps (`src/home.rs`, `Home`): how a `Sleep` keeps its
//! service alive without touching the service's shared reference count.
//!
//! Explores: the real `Home` with a loom `Arc` standing for the service reference it
//! keeps, and a loom `AtomicUsize` for the service's users, driven as `ShardedTimer`
//! and `Registration` drive it (`src/timer.rs`: the last user's drop calls `release`
//! on every home; `src/home.rs`: a sleep's drop calls `leave`).
//! Asserts: while a sleep is registered the home holds its reference (the service is
//! alive: the model's "service" `Arc` has a count above the users'); once the last
//! user and the last sleep are gone, no home holds a reference (the service is freed:
//! no leak, no shutdown missed); a reference is taken out at most once.
//! Seeded bugs that make it fail: without the SeqCst fence in `leave` (both sides of
//! the Dekker race read stale: "the service outlived its last user and sleep"); a
//! `release` that does not re-read the sleeps under the lock ("kept while a sleep is
//! registered").
//! Command: as in `ring.rs`, with `--test home`.
#![cfg(loom)]

use loom::sync::atomic::AtomicUsize;
use loom::sync::Arc;
use loom::thread;
use loom_tests::model;
use sharded_timer::__loom::{user_gone, Home};

/// The service: its users count and its homes, as `Inner` holds them.
struct Service {
    users: AtomicUsize,
    homes: [Home<Arc<()>>; 2],
}

/// A user's drop, as `ShardedTimer::drop`: returns the references taken out.
fn drop_user(service: &Service) -> Vec<Arc<()>> {
    user_gone(&service.users, &service.homes)
}

#[test]
fn the_last_sleep_and_the_last_user_racing_free_the_service_once() {
    model(|| {
        // `token` stands for the service's own allocation: the model holds one count,
        // each home's reference one more.
        let token = Arc::new(());
        let service = Arc::new(Service {
            users: AtomicUsize::new(1),
            homes: [Home::new(), Home::new()],
        });
        // A sleep made (on home 0) while the user is alive.
        service.homes[0].enter(&token);
        let sleep = {
            let service = service.clone();
            let token = token.clone();
            thread::spawn(move || {
                // While registered, the home holds the reference.
                assert!(service.homes[0].keeps(), "kept while a sleep is registered");
                let taken = service.homes[0].leave(&service.users);
                drop(token);
                taken
            })
        };
        let user = {
            let service = service.clone();
            thread::spawn(move || drop_user(&service))
        };
        let from_sleep = sleep.join().unwrap();
        let from_user = user.join().unwrap();
        let taken = usize::from(from_sleep.is_some()) + from_user.len();
        assert_eq!(
            taken, 1,
            "the service outlived its last user and sleep, or was taken twice"
        );
        drop(from_sleep);
        drop(from_user);
        assert_eq!(Arc::strong_count(&token), 1, "no home keeps the service");
        assert!(!service.homes[0].keeps() && !service.homes[1].keeps());
    });
}

#[test]
fn a_sleep_made_and_dropped_on_each_home_while_the_user_goes() {
    model(|| {
        let token = Arc::new(());
        let service = Arc::new(Service {
            users: AtomicUsize::new(2),
            homes: [Home::new(), Home::new()],
        });
        // Two users, each making one sleep on its own home, then dropping the sleep
        // and then itself; the sleeps are registered while their user holds on.
        let threads: Vec<_> = (0..2)
            .map(|index| {
                let service = service.clone();
                let token = token.clone();
                thread::spawn(move || {
                    let home = &service.homes[index];
                    home.enter(&token);
                    assert!(home.keeps(), "kept right after entering");
                    let mut taken: Vec<Arc<()>> = home.leave(&service.users).into_iter().collect();
                    taken.extend(drop_user(&service));
                    drop(token);
                    taken
                })
            })
            .collect();
        let mut taken = Vec::new();
        for thread in threads {
            taken.extend(thread.join().unwrap());
        }
        // Each home took a reference once; both must be given back.
        assert_eq!(
            taken.len(),
            2,
            "every home's reference comes out exactly once"
        );
        drop(taken);
        assert_eq!(Arc::strong_count(&token), 1, "no home keeps the service");
    });
}
