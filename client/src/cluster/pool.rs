//! One connection per broker of a cluster, opened when first needed and opened again once
//! it is lost.
//!
//! Invariant: a slot holds at most one connection, and only to the broker of its id (a
//! connection answered by another broker goes to that broker's slot); connecting to a
//! broker happens under its slot's lock, so concurrent callers share one handshake.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::cluster::retry::Deadline;
use crate::{ClientConfig, ClientError, Connection};

/// The longest a cluster client waits for a handshake with a broker it learned from a
/// topology (a leader that was just killed is given up on quickly; the request timeout
/// caps it too).
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

type Slot = Arc<tokio::sync::Mutex<Option<Connection>>>;

pub(crate) struct Pool {
    config: ClientConfig,
    /// The token new connections present: `config.token` until `set_token` replaces it.
    token: Mutex<Option<String>>,
    slots: Mutex<HashMap<u64, Slot>>,
}

impl Pool {
    pub(crate) fn new(config: ClientConfig) -> Pool {
        Pool {
            token: Mutex::new(config.token.clone()),
            config,
            slots: Mutex::new(HashMap::new()),
        }
    }

    fn slot(&self, broker: u64) -> Slot {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        slots.entry(broker).or_default().clone()
    }

    /// Connects to `addr`, within the connect timeout and the deadline.
    pub(crate) async fn dial(
        &self,
        addr: &str,
        deadline: &Deadline,
    ) -> Result<Connection, ClientError> {
        let limit = CONNECT_TIMEOUT
            .min(self.config.request_timeout)
            .min(deadline.remaining());
        let mut config = self.config.clone();
        config.token = self.token.lock().unwrap_or_else(|e| e.into_inner()).clone();
        match tokio::time::timeout(limit, Connection::connect(addr, config)).await {
            Ok(result) => result,
            Err(_) => Err(ClientError::Connect(format!(
                "{addr}: no answer within {limit:?}"
            ))),
        }
    }

    /// The open connection to `broker`, connecting to `addr` when there is none. The
    /// answer may come from another broker if the address now belongs to it (it is then
    /// kept under that broker's id).
    pub(crate) async fn get(
        &self,
        broker: u64,
        addr: &str,
        deadline: &Deadline,
    ) -> Result<Connection, ClientError> {
        let slot = self.slot(broker);
        let mut held = slot.lock().await;
        if let Some(client) = held.as_ref().filter(|c| !c.is_closed()) {
            return Ok(client.clone());
        }
        *held = None;
        let client = self.dial(addr, deadline).await?;
        if client.broker_id() == broker {
            *held = Some(client.clone());
        } else {
            tracing::warn!(
                expected = broker,
                answered = client.broker_id(),
                addr,
                "another broker answered at this address"
            );
            drop(held);
            self.insert(client.clone()).await;
        }
        Ok(client)
    }

    /// The open connection to `broker`, if there is one (never connects).
    pub(crate) fn open(&self, broker: u64) -> Option<Connection> {
        let slot = self.slot(broker);
        let held = slot.try_lock().ok()?;
        held.as_ref().filter(|c| !c.is_closed()).cloned()
    }

    /// Every open connection, by broker id.
    pub(crate) fn open_all(&self) -> Vec<Connection> {
        let mut ids: Vec<u64> = {
            let slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
            slots.keys().copied().collect()
        };
        ids.sort_unstable();
        ids.into_iter().filter_map(|id| self.open(id)).collect()
    }

    /// Presents `token` on every open connection, and in the hello of every later one.
    pub(crate) async fn set_token(&self, token: &str) -> Result<(), ClientError> {
        *self.token.lock().unwrap_or_else(|e| e.into_inner()) = Some(token.to_owned());
        for conn in self.open_all() {
            conn.set_token(token).await?;
        }
        Ok(())
    }

    /// Keeps `client` as its broker's connection, unless that slot holds an open one.
    pub(crate) async fn insert(&self, client: Connection) -> Connection {
        let slot = self.slot(client.broker_id());
        let mut held = slot.lock().await;
        match held.as_ref().filter(|c| !c.is_closed()) {
            Some(open) => open.clone(),
            None => {
                *held = Some(client.clone());
                client
            }
        }
    }
}
