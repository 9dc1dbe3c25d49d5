//! A worker that does its job under a fencelock lease, with the library's client: it takes
//! the lease, renews it between the steps of the job (with its fence, so a late renewal
//! can never extend a newer lease), and releases it at the end (with its fence too).
//!
//! Every step gets the lease's fence, to send with each write it makes to a protected
//! store: a guard refuses the writes of a worker whose lease has passed.

use std::time::Duration;

use fencelock::client::{Client, Error, LockInfo};

/// A worker: one owner name, one TTL for every lease it takes.
#[derive(Debug, Clone)]
pub struct Worker {
    client: Client,
    owner: String,
    ttl: Duration,
}

impl Worker {
    /// A worker of the lease server `client` talks to, taking leases as `owner` for `ttl`.
    pub fn new(client: Client, owner: impl Into<String>, ttl: Duration) -> Self {
        Self {
            client,
            owner: owner.into(),
            ttl,
        }
    }

    /// Takes the lease on `resource`, never waiting: [`Error::Held`] while another owner
    /// holds it.
    pub async fn take(&self, resource: &str) -> Result<LockInfo, Error> {
        self.client.acquire(resource, &self.owner, self.ttl).await
    }

    /// Extends `lease` by the worker's TTL from now; [`Error::LeaseLost`] if it has passed
    /// (stop the job then).
    pub async fn renew(&self, lease: &LockInfo) -> Result<LockInfo, Error> {
        self.client
            .renew(&lease.resource, &self.owner, self.ttl, Some(lease.fence))
            .await
    }

    /// Gives `lease` back, so the next owner need not wait for its expiry.
    pub async fn release(&self, lease: LockInfo) -> Result<(), Error> {
        self.client
            .release(&lease.resource, &self.owner, Some(lease.fence))
            .await
    }

    /// Runs a job of `steps` on `resource`: takes the lease, runs each step with its fence
    /// and renews the lease after it, then releases the lease. A step runs only while the
    /// lease is held: when a renewal fails, the job stops there with that error (the lease
    /// expires by itself). Answers the fence the job ran under.
    pub async fn run<T>(
        &self,
        resource: &str,
        steps: impl IntoIterator<Item = T>,
        mut step: impl AsyncFnMut(i64, T),
    ) -> Result<i64, Error> {
        let mut lease = self.take(resource).await?;
        for item in steps {
            step(lease.fence, item).await;
            lease = self.renew(&lease).await?;
        }
        let fence = lease.fence;
        self.release(lease).await?;
        Ok(fence)
    }
}
