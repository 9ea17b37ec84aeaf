//! Model 16: a core's home of sleeps (`src/home.rs`, `Users` and `Home`): how a
//! `Sleep` keeps its service alive without touching the service's shared reference
//! count. A sleep holds its core's home's `Arc`; the service's users share `Users`,
//! which holds every home's `Arc`, and whose drop (the last user's) hands the service
//! to each home before letting the homes go.
//!
//! Explores: the real `Users` and `Home`, with a loom `Arc` of a probe standing for
//! the service (its drop is the shutdown), driven as `ShardedTimer` drives them
//! (`src/timer.rs`: a user holds an `Arc<Users>` and a reference to the service; a
//! sleep clones a home's `Arc` from a user and drops it when done).
//! Asserts: while a sleep is registered the service is not freed, whichever user goes
//! last and whenever; once the last user and the last sleep are gone the service is
//! freed (no leak, no shutdown missed); it is freed once (the probe's drop).
//! Seeded bugs that make it fail: `Users`'s drop handing the service only to the home
//! of the dropping thread's core (`homes[0]` in a scratch edit: "the service was freed
//! while a sleep was registered"); a `Users` drop that keeps nothing (the same).
//! Command: as in `ring.rs`, with `--test home`.
#![cfg(loom)]

use loom::sync::atomic::{AtomicBool, Ordering};
use loom::sync::Arc;
use loom::thread;
use loom_tests::{model, trace};
use sharded_timer::__loom::{Home, Users};

/// The service: its drop is the shutdown, recorded in `freed`.
struct Service {
    freed: Arc<AtomicBool>,
}

impl Drop for Service {
    fn drop(&mut self) {
        assert!(!self.freed.swap(true, Ordering::SeqCst), "freed twice");
    }
}

/// A user, as `ShardedTimer` is: the users' share and its own reference.
#[derive(Clone)]
struct User {
    users: Arc<Users<Home<Arc<Service>>, Arc<Service>>>,
    _service: Arc<Service>,
}

/// A service with two homes and one user.
fn service() -> (User, Arc<AtomicBool>) {
    let freed = Arc::new(AtomicBool::new(false));
    let service = Arc::new(Service {
        freed: freed.clone(),
    });
    let homes: Box<[Arc<Home<Arc<Service>>>]> =
        vec![Arc::new(Home::new()), Arc::new(Home::new())].into();
    let user = User {
        users: Arc::new(Users::new(homes, service.clone())),
        _service: service,
    };
    (user, freed)
}

#[test]
fn a_sleep_keeps_the_service_while_its_last_user_goes() {
    model(|| {
        let (user, freed) = service();
        // A sleep made on home 1 from the user, then sent to its own thread.
        let sleep = user.users.homes()[1].clone();
        let sleeper = {
            let freed = freed.clone();
            thread::spawn(move || {
                assert!(
                    !freed.load(Ordering::SeqCst),
                    "the service was freed while a sleep was registered"
                );
                drop(sleep);
                trace("sleep dropped");
            })
        };
        let dropper = thread::spawn(move || {
            drop(user);
            trace("last user dropped");
        });
        sleeper.join().unwrap();
        dropper.join().unwrap();
        assert!(
            freed.load(Ordering::SeqCst),
            "the service outlived its last user and sleep"
        );
    });
}

#[test]
fn sleeps_on_both_homes_and_two_users_going_in_any_order() {
    model(|| {
        let (user, freed) = service();
        let other = user.clone();
        // Each user makes a sleep on its own home and passes it on; then the user
        // goes; the sleep checks the service, then goes.
        let threads: Vec<_> = [user, other]
            .into_iter()
            .enumerate()
            .map(|(index, user)| {
                let freed = freed.clone();
                thread::spawn(move || {
                    let sleep = user.users.homes()[index].clone();
                    drop(user);
                    assert!(
                        !freed.load(Ordering::SeqCst),
                        "the service was freed while a sleep was registered"
                    );
                    drop(sleep);
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        assert!(
            freed.load(Ordering::SeqCst),
            "the service outlived its last user and sleep"
        );
    });
}
