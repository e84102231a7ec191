//! Phase 5: the plan of the job, the store over the cache, and then whatever a crash
//! interrupted is finished (see `node::resume`), or the new shares of a job whose number of
//! ranks changed are filled (`node::regrow`).

use std::sync::Arc;

use super::StartError;
use super::agree::refusal;
use crate::cache::{CacheBackend, CacheDir, SampleStore};
use crate::comm::Comm;
use crate::config::{ExchangeMode, MountConfig};
use crate::daemon::resize::{self, Job};
use crate::dataset::Manifest;
use crate::exchange::ExchangeConfig;
use crate::node::regrow::{self, RegrowConfig};
use crate::node::resume;
use crate::node::resumed::Resumed;
use crate::plan::elastic::ElasticPlan;
use crate::plan::{Plan, PlanParams};

/// The job's plan, and its elastic plan if the job ever changed its number of ranks.
pub(crate) fn plan(
    comm: &dyn Comm,
    config: &MountConfig,
    params: PlanParams,
    job: &Job,
) -> Result<(Plan, Option<ElasticPlan>), StartError> {
    // A coded job (`daemon::coded`): fresh shares every epoch, caches of alpha.
    let coded = config.coded_alpha();
    if job.history.is_resized() {
        if coded.is_some() {
            return Err(refusal(
                vec![(0, "this cache was built by a coded run with another number of compute ranks; a coded run cannot change it yet: start it with the ranks it had, or pass --reset-cache".into())],
                comm.size(),
            ));
        }
        let elastic = ElasticPlan::new(params, job.history.clone())?;
        return Ok((elastic.current().clone(), Some(elastic)));
    }
    let plan = match coded {
        Some(alpha) => Plan::coded(params, alpha)?,
        None => Plan::with_scope(params, config.scope(), comm.hosts())?,
    };
    if let Some(layout) = plan.layout() {
        tracing::info!(layout = %layout.describe(), "exchange scope node: samples move only between ranks of one host");
    }
    Ok((plan, None))
}

/// The store over this rank's cache, with what it holds.
pub(crate) fn open_store(
    config: &MountConfig,
    (dir, backend): (CacheDir, Box<dyn CacheBackend>),
    manifest: Manifest,
    world: u32,
) -> Result<Arc<SampleStore>, StartError> {
    let manifest = Arc::new(manifest);
    let dataset = config.format().open(&config.source, manifest.clone());
    Ok(Arc::new(SampleStore::with_backend_for(
        dir, backend, manifest, dataset, world,
    )?))
}

/// Brings `store` to the job's epoch, holding what that epoch needs (a partial cache: what
/// its gate admits).
pub(crate) fn fill(
    comm: &mut dyn Comm,
    config: &MountConfig,
    store: Arc<SampleStore>,
    (plan, elastic): (&Plan, Option<&ElasticPlan>),
    job: Job,
) -> Result<(Arc<SampleStore>, Resumed), StartError> {
    let manifest = store.manifest().clone();
    let dataset = config.format().open(&config.source, manifest.clone());
    let resumed = match elastic {
        Some(elastic) => {
            let orphans = resize::open_orphans(job.orphans, &manifest, &dataset);
            let share_disk = match &config.exchange {
                ExchangeMode::Partial { share_disk, .. } => *share_disk,
                ExchangeMode::Coded { .. } => false,
            };
            let cfg = RegrowConfig {
                exchange: ExchangeConfig {
                    rate: config.exchange_rate,
                    ..ExchangeConfig::default()
                },
                share_disk,
            };
            regrow::regrow(comm, &store, elastic, job.epoch, orphans, &cfg)?
        }
        None => resume::resume(comm, &store, plan, job.epoch)?,
    };
    Ok((store, resumed))
}

/// The fit phase, then the fill (collective). Before the fill: a resumed partial cache
/// finishes its exchange within its size. A refusal removes a cache this mount made
/// (`made`: see `made_by_this_mount`; the folder itself only when it made it).
pub(crate) fn fit_and_fill(
    comm: &mut dyn Comm,
    config: &MountConfig,
    plans: (&Plan, Option<&ElasticPlan>),
    store: Arc<SampleStore>,
    (cache, made): (&std::path::Path, Option<bool>),
    job: Job,
) -> Result<(Option<super::fit::Fit>, Arc<SampleStore>, Resumed), StartError> {
    let fit = match plans.0.coded_shares() {
        Some(shares) => {
            super::fit_coded::phase(comm, config, shares, &store, cache, job.epoch).map(Some)
        }
        None => super::fit::phase(comm, config, plans, &store, cache, job.epoch),
    };
    let fit = match fit {
        Ok(fit) => fit,
        Err(e) => match made {
            Some(folder) => return Err(super::fit::forget(store, (cache, folder), e)),
            None => return Err(e),
        },
    };
    let (store, resumed) = fill(comm, config, store, plans, job)?;
    Ok((fit, store, resumed))
}
