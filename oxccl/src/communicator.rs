//! The communicator users hold: `comm-core`'s [`CoreCommunicator`] with
//! this crate's transports wired into its constructors.
//!
//! Why a wrapper: the engine cannot name the concrete transports (they
//! depend on it), so the constructors that pick them live here; as inherent
//! functions of this type they need no trait import. Every call of the
//! engine's communicator is reached through `Deref`; the calls that create
//! communicators or handles (`split`, `split_maybe`, `shrink`,
//! `with_timeout`) are
//! redefined here so that they return this type too.

use crate::{transports, CoreCommunicator};
use comm_core::{Config, Result, UniqueId};
use std::ops::Deref;

/// A group of ranks that run collectives together (`ncclComm_t`).
/// `Send + Sync`: calls may come from any thread; they run in issue order.
/// Every collective, point-to-point and async call is documented on
/// [`CoreCommunicator`], reached through `Deref`.
pub struct Communicator(CoreCommunicator);

impl Communicator {
    /// Join as `rank` of `nranks` (`ncclCommInitRank`), configured from
    /// `OXCCL_*` variables.
    pub fn init(id: &UniqueId, rank: usize, nranks: usize) -> Result<Communicator> {
        Self::init_with_config(id, rank, nranks, Config::from_env()?)
    }

    /// Join with an explicit configuration.
    pub fn init_with_config(
        id: &UniqueId,
        rank: usize,
        nranks: usize,
        config: Config,
    ) -> Result<Communicator> {
        let t = transports(&config)?;
        CoreCommunicator::init_with(id, rank, nranks, config, t).map(Communicator)
    }

    /// Join as the launcher's environment says (oxrun, torchrun, Open MPI,
    /// PMI, Slurm; see [`comm_core::env`]).
    pub fn from_env() -> Result<Communicator> {
        let config = Config::from_env()?;
        let env = crate::launch_env()?;
        let id = env.root.into_id(env.rank, config.timeout)?;
        Self::init_with_config(&id, env.rank, env.nranks, config)
    }

    /// Sub-communicators ([`CoreCommunicator::split`]).
    pub fn split(&self, color: u32, key: i64) -> Result<Communicator> {
        self.0.split(color, key).map(Communicator)
    }

    /// [`CoreCommunicator::split_maybe`]: `None` opts out.
    pub fn split_maybe(&self, color: Option<u32>, key: i64) -> Result<Option<Communicator>> {
        Ok(self.0.split_maybe(color, key)?.map(Communicator))
    }

    /// The survivors' communicator ([`CoreCommunicator::shrink`]).
    pub fn shrink(&self, excluded: &[usize]) -> Result<Communicator> {
        self.0.shrink(excluded).map(Communicator)
    }

    /// A handle whose calls have their own deadline
    /// ([`CoreCommunicator::with_timeout`]).
    pub fn with_timeout(&self, timeout: std::time::Duration) -> Communicator {
        Communicator(self.0.with_timeout(timeout))
    }

    /// The engine's communicator.
    pub fn into_core(self) -> CoreCommunicator {
        self.0
    }
}

impl From<CoreCommunicator> for Communicator {
    fn from(c: CoreCommunicator) -> Communicator {
        Communicator(c)
    }
}

impl Deref for Communicator {
    type Target = CoreCommunicator;

    fn deref(&self) -> &CoreCommunicator {
        &self.0
    }
}

impl std::fmt::Debug for Communicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(&self.0, f)
    }
}
