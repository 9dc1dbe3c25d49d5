//! The guard at the database, on MariaDB (or MySQL): the SQL `fencelock guard sql mysql`
//! prints, applied with the `mariadb` client as an operator applies it, and
//! `CALL fencelock_guard_admit(key, token)` in a transaction of the test's own. Each test has
//! a fresh database, dropped after it.
//!
//! MariaDB is found at `FENCELOCK_TEST_MYSQL_URL` (default `mysql://root@127.0.0.1:3306`);
//! a server that cannot be reached fails the test.

use std::io::Write as _;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use fencelock::domain::{Fence, FenceKey};
use mysql_async::prelude::Queryable as _;
use mysql_async::{Conn, Opts, OptsBuilder};

use crate::guard_sql::{
    NOT_TOKENS, guard_command, key_file, not_tokens_like, on_a_thread_of_its_own, signed_lease,
    tampered,
};

const ADMIT: &str = "CALL fencelock_guard_admit(?, ?)";

fn server_url() -> String {
    std::env::var("FENCELOCK_TEST_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306".to_owned())
}

fn server_opts() -> Opts {
    Opts::from_url(&server_url()).expect("FENCELOCK_TEST_MYSQL_URL is a mysql:// URL")
}

async fn connect(opts: impl Into<Opts>) -> Conn {
    Conn::new(opts).await.unwrap_or_else(|e| {
        panic!(
            "MariaDB for tests is not reachable at {} ({e}); start it or set FENCELOCK_TEST_MYSQL_URL",
            server_url()
        )
    })
}

/// A database of the test's own, with a scratch folder for key files; dropped with it.
struct TestMysql {
    name: String,
    dir: tempfile::TempDir,
}

impl TestMysql {
    async fn new() -> Self {
        let name = format!("fencelock_test_{:016x}", rand::random::<u64>());
        connect(server_opts())
            .await
            .query_drop(format!("CREATE DATABASE {name}"))
            .await
            .expect("creating the test database");
        let dir = tempfile::tempdir().unwrap();
        Self { name, dir }
    }

    /// A fresh database with the printed SQL applied (with the keys of `key_files`).
    async fn guarded(key_files: &[&str]) -> Self {
        let db = Self::new().await;
        db.apply(key_files);
        db
    }

    /// Options for a session on this database as `user` (root: `None`).
    fn opts(&self, user: Option<(&str, &str)>) -> OptsBuilder {
        let builder = OptsBuilder::from_opts(server_opts()).db_name(Some(&self.name));
        match user {
            Some((user, password)) => builder.user(Some(user)).pass(Some(password)),
            None => builder,
        }
    }

    async fn session(&self) -> Conn {
        connect(self.opts(None)).await
    }

    /// Applies what `fencelock guard sql mysql` prints with `--fence-key` for each of
    /// `key_files` (in the scratch folder) through the `mariadb` client.
    fn apply(&self, key_files: &[&str]) {
        let mut args = vec!["sql", "mysql"];
        for file in key_files {
            args.extend(["--fence-key", file]);
        }
        let sql = guard_command(self.dir.path(), &args);
        let opts = server_opts();
        let mut command = Command::new("mariadb");
        command
            .args(["--host", opts.ip_or_hostname()])
            .args(["--port", &opts.tcp_port().to_string()])
            .args(["--user", opts.user().unwrap_or("root")])
            .arg(&self.name)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(password) = opts.pass() {
            command.env("MYSQL_PWD", password);
        }
        let mut client = command.spawn().unwrap_or_else(|e| {
            panic!("running the mariadb client ({e}): install Debian's mariadb-client")
        });
        client
            .stdin
            .take()
            .unwrap()
            .write_all(sql.as_bytes())
            .unwrap();
        let output = client.wait_with_output().unwrap();
        assert!(
            output.status.success(),
            "applying the printed SQL with mariadb: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }

    fn key(&self, name: &str) -> FenceKey {
        key_file(self.dir.path(), name).1
    }

    async fn fence_of(&self, key: &str) -> Option<i64> {
        self.session()
            .await
            .exec_first(
                "SELECT fence FROM fencelock_guard_fences WHERE `key` = ?",
                (key,),
            )
            .await
            .unwrap()
    }
}

impl Drop for TestMysql {
    fn drop(&mut self) {
        drop_from_drop(format!("DROP DATABASE IF EXISTS {}", self.name));
    }
}

/// Runs `sql` (a `DROP`) on the server from a `Drop`, which runs inside the test's runtime
/// and cannot block on it: on a thread and runtime of its own. A failure is only reported.
fn drop_from_drop(sql: String) {
    let dropping = sql.clone();
    let dropped = on_a_thread_of_its_own(async move {
        let mut session = Conn::new(server_opts()).await?;
        session.query_drop(dropping).await?;
        session.disconnect().await
    });
    if let Err(e) = dropped {
        eprintln!("could not run {sql}: {e}");
    }
}

/// What the procedure answered: admitted, or refused with a SQLSTATE and message.
#[derive(Debug, PartialEq, Eq)]
enum Answer {
    Admitted,
    Refused { state: String, message: String },
}

impl Answer {
    #[track_caller]
    fn refused(self, state: &str) -> String {
        match self {
            Self::Refused {
                state: got,
                message,
            } if got == state => message,
            other => panic!("expected a refusal with SQLSTATE {state}, got {other:?}"),
        }
    }
}

async fn admit(session: &mut Conn, key: &str, token: &str) -> Answer {
    match session.exec_drop(ADMIT, (key, token)).await {
        Ok(()) => Answer::Admitted,
        Err(mysql_async::Error::Server(e)) => Answer::Refused {
            state: e.state,
            message: e.message,
        },
        Err(e) => panic!("CALL fencelock_guard_admit({key:?}, {token:?}): {e}"),
    }
}

/// The printed SQL applies twice; the procedure takes a fence at least the highest and
/// refuses a lower one (naming the current fence) and anything that is not a fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_printed_sql_applies_twice_and_admits_by_the_fence() {
    let db = TestMysql::guarded(&[]).await;
    db.apply(&[]);
    let mut session = db.session().await;

    assert_eq!(admit(&mut session, "report", "5").await, Answer::Admitted);
    assert_eq!(admit(&mut session, "report", "5").await, Answer::Admitted);
    let message = admit(&mut session, "report", "3").await.refused("FL409");
    assert!(message.contains("the current fence is 5"), "{message}");
    for garbage in NOT_TOKENS {
        let message = admit(&mut session, "report", garbage)
            .await
            .refused("FL400");
        assert!(
            message.starts_with("not a fence token"),
            "{garbage:?}: {message}"
        );
    }
    assert_eq!(db.fence_of("report").await, Some(5));
    assert_eq!(
        admit(&mut session, "report", "9007199254740991").await,
        Answer::Admitted
    );
    assert_eq!(db.fence_of("report").await, Some(9_007_199_254_740_991));
    // Keys differ by case, and by trailing spaces (which MySQL's PAD SPACE collations would
    // ignore): each has its own fence.
    assert_eq!(admit(&mut session, "Report", "1").await, Answer::Admitted);
    assert_eq!(db.fence_of("Report").await, Some(1));
    assert_eq!(admit(&mut session, "report ", "2").await, Answer::Admitted);
    assert_eq!(db.fence_of("report ").await, Some(2));
    assert_eq!(db.fence_of("report").await, Some(9_007_199_254_740_991));

    // Long keys and tokens are refused with a message MySQL can carry (128 characters),
    // the current fence first.
    let long_key = "'".repeat(255);
    assert_eq!(admit(&mut session, &long_key, "5").await, Answer::Admitted);
    let message = admit(&mut session, &long_key, "4").await.refused("FL409");
    assert!(message.contains("the current fence is 5"), "{message}");
    let message = admit(&mut session, "report", &"x".repeat(300))
        .await
        .refused("FL400");
    assert!(message.starts_with("not a fence token"), "{message}");
    let too_long = "k".repeat(256);
    admit(&mut session, &too_long, "5").await.refused("FL400");
}

/// A fences table an earlier script made, with a VARCHAR key that pads with spaces, is
/// converted when the script is applied again: its fences stay, and keys that differ only by
/// trailing spaces no longer share one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn applying_again_converts_an_earlier_fences_table() {
    let db = TestMysql::new().await;
    let mut session = db.session().await;
    session
        .query_drop(
            "CREATE TABLE fencelock_guard_fences (
                `key` VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
                fence BIGINT NOT NULL,
                updated_at DATETIME(6) NOT NULL,
                CONSTRAINT fencelock_guard_fences_pkey PRIMARY KEY (`key`)
            ) ENGINE = InnoDB",
        )
        .await
        .unwrap();
    session
        .query_drop("INSERT INTO fencelock_guard_fences VALUES ('report', 5, UTC_TIMESTAMP(6))")
        .await
        .unwrap();
    drop(session);
    db.apply(&[]);
    db.apply(&[]);

    let mut session = db.session().await;
    let message = admit(&mut session, "report", "4").await.refused("FL409");
    assert!(message.contains("the current fence is 5"), "{message}");
    assert_eq!(admit(&mut session, "report ", "1").await, Answer::Admitted);
    assert_eq!(db.fence_of("report ").await, Some(1));
    assert_eq!(db.fence_of("report").await, Some(5));
}

/// A refusal rolls the caller's transaction back, as PostgreSQL's ends it: nothing of it is
/// written, not even what it wrote before the call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_admit_leaves_nothing_of_its_transaction() {
    let db = TestMysql::guarded(&[]).await;
    let mut session = db.session().await;
    session
        .query_drop("CREATE TABLE docs (`key` VARCHAR(64) PRIMARY KEY, body TEXT NOT NULL)")
        .await
        .unwrap();
    assert_eq!(admit(&mut session, "doc", "5").await, Answer::Admitted);

    // A stale fence, and a token refused before any fence is compared.
    for (token, state) in [("3", "FL409"), ("x", "FL400")] {
        session.query_drop("START TRANSACTION").await.unwrap();
        session
            .query_drop("INSERT INTO docs VALUES ('doc', 'written before the call')")
            .await
            .unwrap();
        admit(&mut session, "doc", token).await.refused(state);
        session.query_drop("COMMIT").await.unwrap();
        let docs: Option<i64> = session
            .query_first("SELECT COUNT(*) FROM docs")
            .await
            .unwrap();
        assert_eq!(docs, Some(0), "after {token:?}");
        assert_eq!(db.fence_of("doc").await, Some(5));
    }

    // An admitted fence rolled back with its transaction was never admitted.
    session.query_drop("START TRANSACTION").await.unwrap();
    assert_eq!(admit(&mut session, "doc", "8").await, Answer::Admitted);
    session.query_drop("ROLLBACK").await.unwrap();
    assert_eq!(db.fence_of("doc").await, Some(5));
}

/// With the lease server's key installed, its `fence_token` (the server was started with
/// `--fence-key`) is admitted for its resource only; a bare fence, a tampered signature and
/// another key's are refused (`FL403`), and what is no token at all is `FL400`, as without
/// keys. Applied again with the new key and the old, tokens of both
/// pass; with the new key alone, the old key's do not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_keys_only_the_lease_servers_token_for_its_resource_is_admitted() {
    let db = TestMysql::new().await;
    let (file, old) = key_file(db.dir.path(), "old.key");
    db.apply(&["old.key"]);
    let (token, fence) = signed_lease(db.dir.path(), &file, "ledger").await;
    let token = token.as_str();
    let mut session = db.session().await;

    let message = admit(&mut session, "another", token).await.refused("FL403");
    assert!(
        message.contains("not signed by an installed key"),
        "{message}"
    );
    let message = admit(&mut session, "ledger", &fence.to_string())
        .await
        .refused("FL403");
    assert!(message.contains("bare fence"), "{message}");
    admit(&mut session, "ledger", &tampered(token))
        .await
        .refused("FL403");
    let signed = |key: &FenceKey, fence| key.sign("ledger", Fence::new(fence).unwrap());
    admit(
        &mut session,
        "ledger",
        &signed(&FenceKey::from_bytes(vec![1; 32]).unwrap(), fence),
    )
    .await
    .refused("FL403");
    // What is no token at all is FL400 with keys as without, never FL403.
    for garbage in not_tokens_like(token) {
        let message = admit(&mut session, "ledger", &garbage)
            .await
            .refused("FL400");
        assert!(
            message.starts_with("not a fence token"),
            "{garbage:?}: {message}"
        );
    }
    assert_eq!(db.fence_of("ledger").await, None);
    assert_eq!(admit(&mut session, "ledger", token).await, Answer::Admitted);
    assert_eq!(db.fence_of("ledger").await, Some(fence));

    // Rotation: the new key and the old, then the new alone. A key longer than a SHA-256
    // block is installed as HMAC uses it.
    let new_file = db.dir.path().join("new.key");
    std::fs::write(&new_file, rand::random::<[u8; 32]>().repeat(3)).unwrap();
    let new = FenceKey::read(&new_file).unwrap();
    db.apply(&["new.key", "old.key"]);
    let next = fence + 1;
    assert_eq!(
        admit(&mut session, "ledger", &signed(&old, next)).await,
        Answer::Admitted
    );
    assert_eq!(
        admit(&mut session, "ledger", &signed(&new, next + 1)).await,
        Answer::Admitted
    );
    db.apply(&["new.key"]);
    admit(&mut session, "ledger", &signed(&old, next + 2))
        .await
        .refused("FL403");
    assert_eq!(
        admit(&mut session, "ledger", &signed(&new, next + 2)).await,
        Answer::Admitted
    );
    // Without --fence-key, the installed key stays.
    db.apply(&[]);
    admit(&mut session, "ledger", &(next + 3).to_string())
        .await
        .refused("FL403");
}

/// A user granted only EXECUTE on the procedure may call it (it runs as its definer), but
/// cannot read the keys or change a fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_granted_only_the_procedure_can_admit_but_cannot_read_the_keys() {
    let db = TestMysql::new().await;
    let key = db.key("fence.key");
    db.apply(&["fence.key"]);
    let user = TestMysqlUser::create(&db).await;
    let mut session = connect(db.opts(Some((&user.name, TestMysqlUser::PASSWORD)))).await;

    admit(&mut session, "k", "5").await.refused("FL403");
    let token = key.sign("k", Fence::new(5).unwrap());
    assert_eq!(admit(&mut session, "k", &token).await, Answer::Admitted);
    for sql in [
        "SELECT COUNT(*) FROM fencelock_guard_fence_keys",
        "SELECT COUNT(*) FROM fencelock_guard_fences",
        "UPDATE fencelock_guard_fences SET fence = 1",
        "DELETE FROM fencelock_guard_fences",
    ] {
        match session.query_drop(sql).await {
            // ER_TABLEACCESS_DENIED_ERROR
            Err(mysql_async::Error::Server(e)) => assert_eq!(e.code, 1142, "{sql}: {e}"),
            other => panic!("{sql}: {other:?}"),
        }
    }
    session.disconnect().await.unwrap();
    assert_eq!(db.fence_of("k").await, Some(5));
}

/// A user of the test's own, granted EXECUTE on the guard's procedure alone, dropped with
/// it. Users belong to the whole server, not to the test's database.
struct TestMysqlUser {
    name: String,
}

impl TestMysqlUser {
    const PASSWORD: &str = "fencelock-plain";

    async fn create(db: &TestMysql) -> Self {
        let name = format!("fl_plain_{:08x}", rand::random::<u32>());
        let mut admin = connect(server_opts()).await;
        admin
            .query_drop(format!(
                "CREATE USER '{name}'@'%' IDENTIFIED BY '{}'",
                Self::PASSWORD
            ))
            .await
            .unwrap();
        let user = Self { name };
        admin
            .query_drop(format!(
                "GRANT EXECUTE ON PROCEDURE {}.fencelock_guard_admit TO '{}'@'%'",
                db.name, user.name
            ))
            .await
            .unwrap();
        user
    }
}

impl Drop for TestMysqlUser {
    fn drop(&mut self) {
        drop_from_drop(format!("DROP USER IF EXISTS '{}'@'%'", self.name));
    }
}

/// Two transactions admitting fences for one key: the second waits inside InnoDB for the
/// first to commit, then sees the fence the first admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_transactions_on_one_key_serialize() {
    let db = TestMysql::guarded(&[]).await;
    let mut first = db.session().await;
    assert_eq!(admit(&mut first, "k", "1").await, Answer::Admitted);
    first.query_drop("START TRANSACTION").await.unwrap();
    assert_eq!(admit(&mut first, "k", "5").await, Answer::Admitted);

    let mut second = db.session().await;
    let second_id = second.id();
    let waiting = tokio::spawn(async move {
        second.query_drop("START TRANSACTION").await.unwrap();
        let answer = admit(&mut second, "k", "4").await;
        second.query_drop("ROLLBACK").await.unwrap();
        answer
    });
    let mut watcher = db.session().await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while lock_waits(&mut watcher, second_id).await != 1 {
        if Instant::now() > deadline || waiting.is_finished() {
            let transactions: Vec<(u64, String)> = watcher
                .query("SELECT trx_mysql_thread_id, trx_state FROM information_schema.INNODB_TRX")
                .await
                .unwrap();
            let sessions: Vec<(u64, Option<String>, Option<String>)> = watcher
                .query("SELECT ID, STATE, INFO FROM information_schema.PROCESSLIST")
                .await
                .unwrap();
            let answer = match waiting.is_finished() {
                true => Some(waiting.await.unwrap()),
                false => None,
            };
            panic!(
                "session {second_id} was not seen waiting for the key's row: transactions \
                 {transactions:?}, sessions {sessions:?}, its admit finished: {answer:?}"
            );
        }
        tokio::time::sleep(INNODB_TRX_REFRESH).await;
    }
    assert!(!waiting.is_finished(), "the second admit did not wait");

    first.query_drop("COMMIT").await.unwrap();
    let message = waiting.await.unwrap().refused("FL409");
    assert!(message.contains("the current fence is 5"), "{message}");
    assert_eq!(db.fence_of("k").await, Some(5));
}

/// How long to leave `information_schema.INNODB_TRX` unread between two looks: InnoDB
/// refreshes the table only once it has not been read for 0.1 s (so that a join of its
/// tables reads one version), and a faster poll would read the first version for ever.
const INNODB_TRX_REFRESH: Duration = Duration::from_millis(150);

/// Whether session `id` waits for a row lock, as InnoDB reports it.
async fn lock_waits(watcher: &mut Conn, id: u32) -> i64 {
    let waits: Option<i64> = watcher
        .exec_first(
            "SELECT COUNT(*) FROM information_schema.INNODB_TRX
             WHERE trx_mysql_thread_id = ? AND trx_state = 'LOCK WAIT'",
            (id,),
        )
        .await
        .unwrap();
    waits.unwrap_or_default()
}

/// The MySQL example of the library's documentation (`fencelock::guard::sql`), as it is
/// there, does what it says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_example_works() {
    let db = TestMysql::guarded(&[]).await;
    let mut session = db.session().await;
    session
        .query_drop(
            "CREATE TABLE invoices (id INT PRIMARY KEY, total INT NOT NULL);
             INSERT INTO invoices VALUES (7, 100)",
        )
        .await
        .unwrap();
    let example = crate::guard_sql::documented_example("START TRANSACTION;");
    session.query_drop(example).await.unwrap();
    let total: Option<i32> = session
        .query_first("SELECT total FROM invoices WHERE id = 7")
        .await
        .unwrap();
    assert_eq!(total, Some(120));
    assert_eq!(db.fence_of("invoice:7").await, Some(42));
}
