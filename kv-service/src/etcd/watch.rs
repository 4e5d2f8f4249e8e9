//! Watches on etcd: a prefix watch of the namespace's keys, opened again
//! from the next revision when etcd ends it, as tessel's events.

use super::*;

impl EtcdKv {
    /// [`KvStore::watch`]: one etcd watch, opened again from the next
    /// revision when etcd ends it.
    pub(super) async fn watch_prefix(
        &self,
        prefix: &[u8],
        from_revision: u64,
    ) -> Result<WatchStream> {
        self.opts.limits.check_key(prefix)?;
        let p = self.data_key(prefix);
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Event>>(256);
        let watch = self.watch.clone();
        let strip = self.opts.namespace.len() + 2;
        // Open the first watch here, so a bad start fails the call.
        let first = open_prefix_watch(&watch, &p, from_revision.max(1)).await?;
        tokio::spawn(async move {
            let mut next_from = from_revision.max(1);
            let mut stream = Some(first);
            let mut requested_oldest = from_revision <= 1;
            loop {
                let mut s = match stream.take() {
                    Some(s) => s,
                    None => match open_prefix_watch(&watch, &p, next_from).await {
                        Ok(s) => s,
                        Err(KvError::Unavailable(_)) => {
                            if tx.is_closed() {
                                return;
                            }
                            tokio::time::sleep(Duration::from_millis(100)).await;
                            continue;
                        }
                        Err(e) => {
                            let _ = tx.send(Err(e)).await;
                            return;
                        }
                    },
                };
                loop {
                    let msg = tokio::select! {
                        m = s.message() => m,
                        () = tx.closed() => return,
                    };
                    let msg = match msg {
                        Ok(Some(m)) => m,
                        Ok(None) | Err(_) => break,
                    };
                    if msg.canceled() {
                        let oldest = msg.compact_revision().max(0) as u64;
                        if oldest > 0 && requested_oldest {
                            next_from = oldest;
                            break;
                        }
                        let e = if oldest > 0 {
                            KvError::Compacted {
                                requested: next_from,
                                oldest,
                            }
                        } else {
                            KvError::Unavailable(format!(
                                "etcd cancelled the watch: {}",
                                msg.cancel_reason()
                            ))
                        };
                        let _ = tx.send(Err(e)).await;
                        return;
                    }
                    for ev in msg.events() {
                        let Some(kv) = ev.kv() else { continue };
                        let revision = kv.mod_revision() as u64;
                        let event = match ev.event_type() {
                            EventType::Put => Event::Put(KeyValue {
                                key: kv.key()[strip..].to_vec(),
                                value: kv.value().to_vec(),
                                create_revision: kv.create_revision() as u64,
                                mod_revision: revision,
                                lease: (kv.lease() != 0).then_some(kv.lease() as u64),
                            }),
                            EventType::Delete => Event::Delete {
                                key: kv.key()[strip..].to_vec(),
                                revision,
                            },
                        };
                        next_from = revision + 1;
                        requested_oldest = false;
                        if tx.send(Ok(event)).await.is_err() {
                            return;
                        }
                    }
                }
            }
        });
        Ok(tokio_stream_from(rx))
    }
}

async fn open_prefix_watch(
    watch: &WatchClient,
    prefix: &[u8],
    from: u64,
) -> Result<etcd_client::WatchStream> {
    let mut w = watch.clone();
    tokio::time::timeout(
        Duration::from_secs(10),
        w.watch(
            prefix.to_vec(),
            Some(
                WatchOptions::new()
                    .with_prefix()
                    .with_start_revision(from as i64),
            ),
        ),
    )
    .await
    .map_err(|_| KvError::Unavailable("etcd did not open the watch in time".into()))?
    .map_err(|e| map_err(e, None))
}

fn tokio_stream_from(mut rx: tokio::sync::mpsc::Receiver<Result<Event>>) -> WatchStream {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx)).boxed()
}
