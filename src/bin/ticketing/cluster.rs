//! `ticketing cluster`: administers a replicated cluster (PROTOCOL.md 4.4,
//! CLI.md) over the administrative frames of `ticketing::admin`.
//! Every answer is the members'; this asks whichever endpoint answers
//! first, follows it to the leader, and prints one JSON object.
//!
//! Exit status: 0 done, 1 refused (the object's `error` says why), 2 bad
//! arguments, 75 no member reached.

use std::error::Error;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args as ClapArgs, Subcommand};
use serde_json::{json, Value};
use ticketing::admin::{
    AdminReply, AdminRequest, MemberRole, StatusHead, StatusMember, ADMIN_VERSION,
};
use ticketing::raft::{write_backup, Backup, ClusterId};
use ticketing::server::ImageGrant;
use ticketing::tls::ClientTls;
use ticketing::tokio::{Connector, TcpConnector, TlsConnector};
use ticketing::{Endpoint, Name};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::time::{sleep, timeout, Instant};

use crate::common::{Secret, TlsOptions, RAFT_CREDENTIAL_ENV};
use crate::member::RaftPeer;

/// Exit status when no member could be reached (EX_TEMPFAIL).
const UNREACHED: u8 = 75;
/// How long one member has to answer.
const ANSWER_TIME: Duration = Duration::from_secs(5);
/// How long a request follows members to the leader they name.
const FOLLOW_TIME: Duration = Duration::from_secs(10);
/// How long `remove` waits for its change to be committed.
const CHANGE_TIME: Duration = Duration::from_secs(60);

/// Options of `ticketing cluster` (CLI.md).
#[derive(ClapArgs)]
pub struct Args {
    #[command(subcommand)]
    op: Op,
}

#[derive(Subcommand)]
enum Op {
    /// The members, their roles, and (from the leader) how far each is.
    Status(Common),
    /// Hands the leadership to member ID, or to the most caught-up; returns
    /// once it leads.
    Transfer {
        #[command(flatten)]
        common: Common,
        /// The member to hand over to.
        id: Option<u64>,
        /// How long to wait for it to lead.
        #[arg(long, value_name = "N", default_value_t = 10_000)]
        wait_ms: u64,
    },
    /// Adds a member, started with --raft-join, as a learner; returns once
    /// it votes.
    Add {
        #[command(flatten)]
        common: Common,
        /// The new member: `ID=CLIENT_ADDR/RAFT_ADDR`.
        #[arg(value_name = "ID=CLIENT_ADDR/RAFT_ADDR")]
        member: RaftPeer,
        /// How long to wait for it to vote.
        #[arg(long, value_name = "N", default_value_t = 60_000)]
        wait_ms: u64,
    },
    /// Removes a member; returns once the change is committed.
    Remove {
        #[command(flatten)]
        common: Common,
        /// The member to remove.
        id: u64,
        /// Even when the members that would remain do not answer.
        #[arg(long)]
        force: bool,
    },
    /// Writes the leader's committed table to FILE (a temporary, synced,
    /// renamed), for `serve --raft-new-cluster --restore FILE`.
    Snapshot {
        #[command(flatten)]
        common: Common,
        /// Where to write it.
        file: PathBuf,
    },
}

/// What every subcommand takes.
#[derive(ClapArgs)]
struct Common {
    /// A member's client address; several, to try in turn.
    #[arg(long = "endpoint", value_name = "ADDR", required = true)]
    endpoints: Vec<Endpoint>,
    /// The cluster's peer credential (omit for a cluster that runs with
    /// --raft-insecure). Better from the environment.
    #[arg(
        long,
        value_name = "C",
        value_parser = Secret,
        allow_hyphen_values = true,
        env = RAFT_CREDENTIAL_ENV,
        hide_env_values = true
    )]
    raft_credential: Option<Name>,
    /// TLS to the members' client addresses; with a certificate the peer
    /// CA signed (`--tls-cert`), mutual TLS admits it without the
    /// credential.
    #[command(flatten)]
    tls: TlsOptions,
}

/// How a request ended, for the exit status.
enum Ended {
    Done(Value),
    Refused(Value),
    Unreached(String),
    /// Arguments that cannot be carried out as given.
    Usage(String),
}

pub async fn run(args: Args) -> Result<ExitCode, Box<dyn Error>> {
    let ended = match args.op {
        Op::Status(common) => status(&common).await?,
        Op::Transfer {
            common,
            id,
            wait_ms,
        } => transfer(&common, id, Duration::from_millis(wait_ms)).await?,
        Op::Add {
            common,
            member,
            wait_ms,
        } => add(&common, &member, Duration::from_millis(wait_ms)).await?,
        Op::Remove { common, id, force } => remove(&common, id, force).await?,
        Op::Snapshot { common, file } => snapshot(&common, &file).await?,
    };
    Ok(match ended {
        Ended::Done(v) => {
            println!("{v}");
            ExitCode::SUCCESS
        }
        Ended::Refused(v) => {
            println!("{v}");
            ExitCode::from(1)
        }
        Ended::Unreached(why) => {
            println!("{}", json!({"error": "unreachable", "message": why}));
            ExitCode::from(UNREACHED)
        }
        Ended::Usage(why) => {
            eprintln!("ticketing cluster: {why}");
            ExitCode::from(2)
        }
    })
}

/// A connection to a member's client address: TCP, or TLS over it.
trait Stream: AsyncRead + AsyncWrite + Send + Unpin {}
impl<S: AsyncRead + AsyncWrite + Send + Unpin> Stream for S {}

/// How to reach the members: the credential to offer, and TLS if asked.
struct Reach {
    credential: Option<Name>,
    tls: Option<ClientTls>,
}

impl Reach {
    fn of(common: &Common) -> Result<Reach, Box<dyn Error>> {
        Ok(Reach {
            credential: common.raft_credential.clone(),
            tls: common.tls.client_tls()?,
        })
    }

    async fn connect(&self, endpoint: &Endpoint) -> std::io::Result<Box<dyn Stream>> {
        Ok(match &self.tls {
            Some(tls) => Box::new(
                TlsConnector::new(tls.clone())
                    .connect(endpoint.clone())
                    .await?,
            ),
            None => Box::new(TcpConnector.connect(endpoint.clone()).await?),
        })
    }
}

/// An administrative connection to one member.
struct Admin {
    lines: tokio::io::Lines<BufReader<tokio::io::ReadHalf<Box<dyn Stream>>>>,
    write: tokio::io::WriteHalf<Box<dyn Stream>>,
    /// The member's Raft id, as its `WA` said.
    member: u64,
    next_id: u64,
}

/// Why a connection to a member gave nothing.
enum Refusal {
    /// It could not be reached, or closed without a word.
    Unreached(String),
    /// It refused the hello (`E <reason>`).
    Said(String),
    /// It was not asked: the arguments forbid it.
    Usage(String),
}

impl Admin {
    /// Connects to `endpoint` and says the administrative hello.
    async fn open(endpoint: &Endpoint, reach: &Reach) -> Result<Admin, Refusal> {
        let credential = reach.credential.as_ref();
        if credential.is_some() && reach.tls.is_none() {
            let addrs: Vec<SocketAddr> = tokio::net::lookup_host(endpoint.as_str())
                .await
                .map_err(|e| Refusal::Unreached(format!("{endpoint}: {e}")))?
                .collect();
            if !addrs.iter().all(|a| a.ip().is_loopback()) {
                // The credential is the members' own: never in the clear
                // beyond this machine.
                return Err(Refusal::Usage(format!(
                    "{endpoint} is not a loopback address: the peer credential is not sent to it without TLS"
                )));
            }
        }
        let stream = timeout(ANSWER_TIME, reach.connect(endpoint))
            .await
            .map_err(|_| Refusal::Unreached(format!("{endpoint}: no connection in time")))?
            .map_err(|e| Refusal::Unreached(format!("{endpoint}: {e}")))?;
        let (read, write) = tokio::io::split(stream);
        let mut admin = Admin {
            lines: BufReader::new(read).lines(),
            write,
            member: 0,
            next_id: 1,
        };
        admin
            .send(&AdminRequest::Hello {
                version: ADMIN_VERSION,
                credential: credential.cloned(),
            })
            .await
            .map_err(|e| Refusal::Unreached(format!("{endpoint}: {e}")))?;
        match admin.read().await {
            Ok(AdminReply::Welcome { member }) => {
                admin.member = member;
                Ok(admin)
            }
            Ok(AdminReply::Error { reason }) => Err(Refusal::Said(reason.as_str().to_string())),
            Ok(other) => Err(Refusal::Unreached(format!(
                "{endpoint}: answered the hello with {other:?}"
            ))),
            Err(e) => Err(Refusal::Unreached(format!("{endpoint}: {e}"))),
        }
    }

    async fn send(&mut self, request: &AdminRequest) -> std::io::Result<()> {
        let mut line = Vec::new();
        request.encode(&mut line);
        self.write.write_all(&line).await
    }

    /// The next frame the member sends.
    async fn read(&mut self) -> Result<AdminReply, Box<dyn Error>> {
        let line = timeout(ANSWER_TIME, self.lines.next_line())
            .await
            .map_err(|_| "no answer in time")??
            .ok_or("the member closed the connection")?;
        Ok(AdminReply::parse(line.as_bytes())
            .map_err(|e| format!("an answer that is no administrative frame ({e}): {line:?}"))?)
    }

    fn id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// The member's status: its `SR`, and the `SM` lines that follow.
    async fn status(&mut self) -> Result<(StatusHead, Vec<StatusMember>), Box<dyn Error>> {
        let id = self.id();
        self.send(&AdminRequest::Status { id }).await?;
        let head = match self.read().await? {
            AdminReply::Status(head) if head.id == id => head,
            other => return Err(format!("status answered with {other:?}").into()),
        };
        let mut members = Vec::new();
        for _ in 0..head.count {
            match self.read().await? {
                AdminReply::Member(m) if m.id == id => members.push(m),
                other => return Err(format!("a member's status was {other:?}").into()),
            }
        }
        Ok((head, members))
    }
}

/// Connects to the first endpoint that admits us; a refused hello ends
/// the request (every member holds the same credential).
async fn first(common: &Common) -> Result<Admin, Ended> {
    let reach = Reach::of(common).map_err(|e| Ended::Usage(e.to_string()))?;
    let mut why = Vec::new();
    for endpoint in &common.endpoints {
        match Admin::open(endpoint, &reach).await {
            Ok(admin) => return Ok(admin),
            Err(Refusal::Said(reason)) => {
                return Err(Ended::Refused(
                    json!({"error": reason, "endpoint": endpoint.as_str()}),
                ))
            }
            Err(Refusal::Usage(why)) => return Err(Ended::Usage(why)),
            Err(Refusal::Unreached(e)) => why.push(e),
        }
    }
    Err(Ended::Unreached(why.join("; ")))
}

fn status_json(head: &StatusHead, members: &[StatusMember]) -> Value {
    let members: Vec<Value> = members
        .iter()
        .map(|m| {
            json!({
                "id": m.member,
                "client": m.client.as_ref().map(Endpoint::as_str),
                "peer": m.peer.as_ref().map(Endpoint::as_str),
                "role": m.role.as_str(),
                "reachable": m.reachable,
                "match": m.matched,
                "lag": m.lag,
                "applied": m.applied,
            })
        })
        .collect();
    json!({
        "cluster": head.cluster.map(|c| format!("{c:032x}")),
        "member": head.member,
        "leader": head.leader,
        "term": head.term,
        "commit": head.commit,
        "members": members,
    })
}

/// The status, from the leader when it can be reached (only it knows how
/// far each member is), else from the member that answered.
async fn status(common: &Common) -> Result<Ended, Box<dyn Error>> {
    let mut admin = match first(common).await {
        Ok(admin) => admin,
        Err(ended) => return Ok(ended),
    };
    let (head, members) = admin.status().await?;
    let leader_addr = head
        .leader
        .filter(|&l| l != head.member)
        .and_then(|l| members.iter().find(|m| m.member == l))
        .and_then(|m| m.client.clone());
    if let Some(addr) = leader_addr {
        let reach = Reach::of(common)?;
        if let Ok(mut leader) = Admin::open(&addr, &reach).await {
            if let Ok((head, members)) = leader.status().await {
                return Ok(Ended::Done(status_json(&head, &members)));
            }
        }
    }
    Ok(Ended::Done(status_json(&head, &members)))
}

/// Sends the request `make` builds to the leader, following members that
/// name it (`not_leader`) or hand over to another (`handing_over`), and
/// trying the next endpoint when one knows no leader (a member that is
/// joining, say); returns the leader's connection and its answer:
/// anything but one of those two refusals, or the last refusal when no
/// member led.
async fn ask_leader(
    common: &Common,
    make: impl Fn(u64) -> AdminRequest,
) -> Result<Result<(Admin, AdminReply), Ended>, Box<dyn Error>> {
    let reach = match Reach::of(common) {
        Ok(reach) => reach,
        Err(e) => return Ok(Err(Ended::Usage(e.to_string()))),
    };
    let deadline = Instant::now() + FOLLOW_TIME;
    let mut last = None;
    let mut unreached = Vec::new();
    for endpoint in &common.endpoints {
        let mut next = Some(endpoint.clone());
        while let Some(addr) = next.take() {
            let mut admin = match Admin::open(&addr, &reach).await {
                Ok(admin) => admin,
                Err(Refusal::Said(reason)) => {
                    return Ok(Err(Ended::Refused(json!({"error": reason}))))
                }
                Err(Refusal::Usage(why)) => return Ok(Err(Ended::Usage(why))),
                Err(Refusal::Unreached(e)) => {
                    unreached.push(e);
                    break;
                }
            };
            let id = admin.id();
            admin.send(&make(id)).await?;
            let reply = admin.read().await?;
            match &reply {
                AdminReply::Refused { error, leader, .. }
                    if matches!(error.as_str(), "not_leader" | "handing_over")
                        && Instant::now() < deadline =>
                {
                    // A member handing over names the next leader before
                    // it leads.
                    if leader.is_some() {
                        sleep(Duration::from_millis(50)).await;
                    }
                    next = leader.clone();
                    last = Some((admin, reply));
                }
                _ => return Ok(Ok((admin, reply))),
            }
        }
    }
    Ok(match last {
        Some(asked) => Ok(asked),
        None => Err(Ended::Unreached(unreached.join("; "))),
    })
}

/// A refusal as the object printed.
fn refused(reply: &AdminReply, what: &str) -> Result<Ended, Box<dyn Error>> {
    match reply {
        AdminReply::Refused { error, .. } => Ok(Ended::Refused(json!({"error": error.as_str()}))),
        other => Err(format!("{what} answered with {other:?}").into()),
    }
}

/// Polls `admin`'s status until `done` says so (its answer), or `wait`
/// runs out (`None`).
async fn until_status<T>(
    admin: &mut Admin,
    wait: Duration,
    done: impl Fn(&StatusHead, &[StatusMember]) -> Option<T>,
) -> Option<T> {
    let deadline = Instant::now() + wait;
    loop {
        if let Ok((head, members)) = admin.status().await {
            if let Some(t) = done(&head, &members) {
                return Some(t);
            }
        }
        if Instant::now() >= deadline {
            return None;
        }
        sleep(Duration::from_millis(20)).await;
    }
}

/// Asks the leader to hand over, then waits until the member it chose
/// leads.
async fn transfer(
    common: &Common,
    to: Option<u64>,
    wait: Duration,
) -> Result<Ended, Box<dyn Error>> {
    let (mut admin, reply) =
        match ask_leader(common, |id| AdminRequest::Transfer { id, to }).await? {
            Ok(asked) => asked,
            Err(ended) => return Ok(ended),
        };
    let AdminReply::Transferring { to: chosen, .. } = reply else {
        return refused(&reply, "transfer");
    };
    // The member chosen leads once a member's status says so; the one that
    // handed over says it as soon as it hears of the new term.
    let led = until_status(&mut admin, wait, |head, _| {
        (head.leader == Some(chosen)).then_some(head.term)
    })
    .await;
    Ok(match led {
        Some(term) => Ended::Done(json!({"transferred": chosen, "leader": chosen, "term": term})),
        None => Ended::Refused(json!({
            "error": "not_transferred",
            "to": chosen,
            "message": "the member chosen did not lead in time; the old leader leads on"
        })),
    })
}

/// Asks the leader to add a member as a learner, then waits until it votes.
async fn add(common: &Common, member: &RaftPeer, wait: Duration) -> Result<Ended, Box<dyn Error>> {
    let (id, client, peer) = (
        member.id(),
        member.client().clone(),
        member.peer_endpoint()?,
    );
    let ask = |n| AdminRequest::Add {
        id: n,
        member: id,
        client: client.clone(),
        peer: peer.clone(),
    };
    let (mut admin, reply) = match ask_leader(common, ask).await? {
        Ok(asked) => asked,
        Err(ended) => return Ok(ended),
    };
    if !matches!(reply, AdminReply::Adding { .. }) {
        return refused(&reply, "add");
    }
    let voter = until_status(&mut admin, wait, |_, members| {
        members
            .iter()
            .any(|m| m.member == id && m.role != MemberRole::Learner)
            .then_some(())
    })
    .await;
    Ok(match voter {
        Some(()) => Ended::Done(json!({"added": id, "voter": true})),
        None => Ended::Refused(json!({
            "added": id,
            "voter": false,
            "error": "not_caught_up",
            "message": "still a learner catching up: kept, and promoted once caught up"
        })),
    })
}

/// Asks the leader to remove a member, then waits until the change is
/// committed (it is out of the configuration).
async fn remove(common: &Common, member: u64, force: bool) -> Result<Ended, Box<dyn Error>> {
    let ask = |id| AdminRequest::Remove { id, member, force };
    let (mut admin, reply) = match ask_leader(common, ask).await? {
        Ok(asked) => asked,
        Err(ended) => return Ok(ended),
    };
    if !matches!(reply, AdminReply::Removing { .. }) {
        return refused(&reply, "remove");
    }
    let gone = until_status(&mut admin, CHANGE_TIME, |head, members| {
        (head.member != member && members.iter().all(|m| m.member != member)).then_some(())
    })
    .await;
    Ok(match gone {
        Some(()) => Ended::Done(json!({"removed": member})),
        None => Ended::Refused(json!({
            "error": "not_removed",
            "message": "the removal was proposed and is not committed yet"
        })),
    })
}

/// Asks the leader for its committed table, and writes it to `file`.
async fn snapshot(common: &Common, file: &Path) -> Result<Ended, Box<dyn Error>> {
    let (mut admin, reply) = match ask_leader(common, |id| AdminRequest::Snapshot { id }).await? {
        Ok(asked) => asked,
        Err(ended) => return Ok(ended),
    };
    let AdminReply::SnapshotHead(head) = reply else {
        return refused(&reply, "snapshot");
    };
    let mut grants = Vec::new();
    for _ in 0..head.count {
        match admin.read().await? {
            AdminReply::SnapshotGrant(g) if g.id == head.id => grants.push(ImageGrant {
                key: g.key,
                token: g.token,
                remaining_ms: g.remaining_ms,
            }),
            other => return Err(format!("a grant of the snapshot was {other:?}").into()),
        }
    }
    let cluster = head.cluster.and_then(ClusterId::new);
    let backup = Backup::new(cluster, head.index, head.floor, grants);
    // What the leader sent is checked as a restore will check the file.
    Backup::decode(&backup.encode())?;
    write_backup(file, &backup)?;
    Ok(Ended::Done(json!({
        "snapshot": file.display().to_string(),
        "cluster": cluster.map(|c| c.to_string()),
        "index": head.index,
        "grants": backup.grants.len(),
        "max_token": backup.max_token(),
    })))
}
