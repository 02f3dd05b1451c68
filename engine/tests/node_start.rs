//! What `arbor node` checks at start and tells an operator while it runs,
//! on real processes: TLS and configuration files that are not regular
//! files or are not what their key says (a FIFO, `/dev/zero`, a leaf
//! certificate as the CA, an expired certificate) stop the start at once,
//! naming the key; a plaintext node whose `access:` names clients by
//! certificate is refused unless told; a certificate about to expire is a
//! warning and a gauge; refused handshakes are logged at warn with their
//! reason; the metrics endpoint serves every counter.

use arbor::certs::{self, Issued, Validity};
use arbor::tls::CertIdentity;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, SystemTime};

/// Bounds every wait; a healthy run needs a small fraction of it.
const PATIENCE: Duration = Duration::from_secs(60);

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn arbor() -> Command {
    Command::new(env!("CARGO_BIN_EXE_arbor"))
}

/// Waits for `child` to exit, at most `PATIENCE` (killed past it, and the
/// test fails: a start that hangs is the bug).
fn exited(mut child: Child) -> (std::process::ExitStatus, String) {
    let mut stderr = child.stderr.take().unwrap();
    let (sender, receiver) = mpsc::channel();
    let pid = child.id();
    std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        let _ = sender.send((child.wait().unwrap(), text));
    });
    match receiver.recv_timeout(PATIENCE) {
        Ok(done) => done,
        Err(_) => {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
            panic!("arbor node {pid} did not stop within {PATIENCE:?}");
        }
    }
}

/// Runs `arbor node --config CONFIG`, expecting it to refuse to start:
/// its stderr.
fn refused(config: &Path) -> String {
    let child = arbor()
        .args(["node", "--config"])
        .arg(config)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (status, stderr) = exited(child);
    assert!(!status.success(), "started: {stderr}");
    stderr
}

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
}

/// A config of replica 1 in `dir` with `tls` (ca, cert, key) and `extra`
/// top-level sections.
fn config(dir: &Path, tls: Option<(&Path, &Path, &Path)>, extra: &str) -> PathBuf {
    let tls = tls.map_or(String::new(), |(ca, cert, key)| {
        format!(
            "  tls:\n    ca: {}\n    cert: {}\n    key: {}\n",
            ca.display(),
            cert.display(),
            key.display()
        )
    });
    let yaml = format!(
        "node:\n  replica_id: 1\n  listen: \"127.0.0.1:{}\"\n{tls}pilorama:\n  path: {}\n{extra}",
        free_port(),
        dir.join("data/tree.db").display()
    );
    let path = dir.join("node.yaml");
    write(&path, &yaml);
    path
}

struct Files {
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
}

/// A CA and replica 1's certificate valid `validity`, in `dir`.
fn node_files(dir: &Path, validity: Validity) -> (Issued, Files) {
    let ca = certs::create_ca("arbor", Validity::days_from_now(30)).unwrap();
    let replica = CertIdentity::Replica {
        cluster_id: "arbor".into(),
        replica_id: 1,
    };
    let node = certs::issue(&ca, &replica, validity).unwrap();
    let files = Files {
        ca: dir.join("ca.crt"),
        cert: dir.join("node.crt"),
        key: dir.join("node.key"),
    };
    write(&files.ca, &ca.cert_pem);
    write(&files.cert, &node.cert_pem);
    write(&files.key, &node.key_pem);
    (ca, files)
}

#[test]
fn files_and_certificates_that_cannot_serve_stop_the_start_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let (_, good) = node_files(dir.path(), Validity::days_from_now(30));
    let fifo = dir.path().join("fifo");
    assert!(Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    let zero = Path::new("/dev/zero");
    let (good_ca, good_cert, key) = (good.ca.as_path(), good.cert.as_path(), good.key.as_path());
    let expired_dir = dir.path().join("expired");
    std::fs::create_dir(&expired_dir).unwrap();
    let now = SystemTime::now();
    let (_, expired) = node_files(
        &expired_dir,
        Validity {
            not_before: now - Duration::from_secs(10 * 86_400),
            not_after: now - Duration::from_secs(86_400),
        },
    );
    let cases: [((&Path, &Path, &Path), &str, &str); 5] = [
        ((&fifo, good_cert, key), "node.tls.ca", "not a regular file"),
        ((good_ca, zero, key), "node.tls.cert", "not a regular file"),
        (
            (good_ca, good_cert, zero),
            "node.tls.key",
            "not a regular file",
        ),
        ((good_cert, good_cert, key), "node.tls.ca", "is not a CA"),
        (
            (&expired.ca, &expired.cert, &expired.key),
            "node.tls.cert",
            "expired at",
        ),
    ];
    for (tls, key_named, why) in cases {
        let stderr = refused(&config(dir.path(), Some(tls), ""));
        assert!(
            stderr.contains(key_named) && stderr.contains(why),
            "{key_named}: {stderr}"
        );
        assert!(
            !dir.path().join("data").exists(),
            "{key_named}: data created"
        );
    }
    // The configuration file itself.
    let stderr = refused(&fifo);
    assert!(stderr.contains("not a regular file"), "{stderr}");
    // Plaintext cannot tell a client by its certificate name.
    let named = "access:\n  default:\n    writers: [gateway-1]\n";
    let stderr = refused(&config(dir.path(), None, named));
    assert!(
        stderr.contains("access:") && stderr.contains("node.insecure_plaintext"),
        "{stderr}"
    );
}

/// A plain HTTP/1.1 GET of `path` on `address`: status line and body.
fn http_get(address: &str, path: &str) -> String {
    let mut stream = std::net::TcpStream::connect(address).unwrap();
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    write!(stream, "GET {path} HTTP/1.1\r\nHost: test\r\n\r\n").unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).unwrap();
    text
}

/// A TLS node whose certificate expires in two days: it starts with a
/// warning, its metrics endpoint shows the countdown and every counter,
/// and a client that is refused at the handshake is logged with why.
#[test]
fn a_running_node_warns_and_counts_what_an_operator_must_know() {
    let dir = tempfile::tempdir().unwrap();
    let (_, files) = node_files(dir.path(), Validity::days_from_now(2));
    let metrics = format!("127.0.0.1:{}", free_port());
    let path = config(dir.path(), Some((&files.ca, &files.cert, &files.key)), "");
    let yaml = std::fs::read_to_string(&path).unwrap().replace(
        "node:\n",
        &format!("node:\n  metrics_listen: \"{metrics}\"\n"),
    );
    write(&path, &yaml);
    let mut child = arbor()
        .args(["node", "--config"])
        .arg(&path)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut lines = Vec::new();
    for _ in 0..2 {
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        lines.push(line);
    }
    let address = lines[0].trim_end().rsplit(' ').next().unwrap().to_string();
    assert!(
        lines[1].contains(&format!("http://{metrics}/metrics")),
        "{lines:?}"
    );

    // A plaintext client at the TLS port: refused at the handshake.
    let plain = arbor()
        .args(["healthcheck", "--addr", &address])
        .output()
        .unwrap();
    assert!(!plain.status.success());

    // The refusal is counted by the node's task for the connection, which
    // may run after the client saw the connection end.
    let deadline = std::time::Instant::now() + PATIENCE;
    let page = loop {
        let page = http_get(&metrics, "/metrics");
        assert!(page.starts_with("HTTP/1.1 200"), "{page}");
        if page.contains("arbor_tcp_handshakes_failed_total 1")
            || std::time::Instant::now() > deadline
        {
            break page;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    for name in [
        "arbor_writes_committed_total 0",
        "arbor_pending_writes 0",
        "arbor_push_pairs_parked 0",
        "arbor_requests_refused_total 0",
        "arbor_tcp_connections_accepted_total",
        "arbor_tcp_handshakes_failed_total 1",
        "arbor_commit_seconds_bucket",
    ] {
        assert!(page.contains(name), "{name} missing:\n{page}");
    }
    let expiry = page
        .lines()
        .find(|l| l.starts_with("arbor_tls_certificate_expiry_seconds{file=\"node.tls.cert\"}"))
        .unwrap_or_else(|| panic!("no expiry gauge:\n{page}"));
    let seconds: i64 = expiry.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(seconds > 86_400 && seconds <= 2 * 86_400, "{expiry}");
    assert!(http_get(&metrics, "/other").starts_with("HTTP/1.1 404"));

    let pid = child.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let (status, stderr) = exited(child);
    assert!(status.success(), "{status:?}: {stderr}");
    assert!(
        stderr.contains("within node.tls_expiry_warning"),
        "{stderr}"
    );
    assert!(stderr.contains("TLS handshake refused"), "{stderr}");
}

/// The endpoint is plaintext: not on a public address unless told.
#[test]
fn the_metrics_endpoint_stays_on_loopback_unless_told() {
    let dir = tempfile::tempdir().unwrap();
    let path = config(dir.path(), None, "");
    let yaml = std::fs::read_to_string(&path).unwrap().replace(
        "node:\n",
        &format!("node:\n  metrics_listen: \"0.0.0.0:{}\"\n", free_port()),
    );
    write(&path, &yaml);
    let stderr = refused(&path);
    assert!(
        stderr.contains("node.metrics_listen") && stderr.contains("loopback"),
        "{stderr}"
    );
}
