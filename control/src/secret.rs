//! The job's secret and the run's epoch (issue 13: authenticated traffic).
//!
//! Every job runs under a fresh random 32-byte [`Secret`]: control-plane frames
//! ([`crate::wire`]) carry a BLAKE3 keyed MAC under it and INI datagrams are sealed
//! (AES-256-GCM) under a key derived from it and the run's epoch, so that nobody
//! without it can forge or alter traffic. It reaches the cluster processes in one
//! of two ways:
//!
//! * **pre-shared**: `multigrain launch` / `multigrain run` write it into a `0600` key
//!   file in the run's private scratch directory and name the file in
//!   [`ENV_KEY_FILE`] (the variable holds a path, not the key: a file readable only by
//!   its owner is the narrowest channel that also works for `ssh`-free local children,
//!   and the key never appears on a command line or in `/proc/PID/environ`). A user may
//!   do the same under `srun`/`mpirun` with a key file on a shared file system. Under a
//!   PMIx launcher (`mpirun`, PRRTE) with no key file, rank 0 generates the secret and
//!   publishes it with its coordinator's address through the launcher's key–value
//!   exchange (the identity module's PMIx rendezvous), which is pre-sharing too. Then
//!   every control frame, the registration included, carries the MAC.
//! * **bootstrapped by the coordinator**: with no key file and no PMIx exchange (`srun`,
//!   `multigrain launch` with remote clusters), cluster 0 generates the secret and sends it to each member in the
//!   [`Welcome`](crate::wire::Message::Welcome) on the member's own control connection;
//!   from then on every frame on that connection carries the MAC. The bootstrap itself
//!   is not authenticated: an attacker who can read the network between a member and
//!   cluster 0 during start-up learns the secret, and a local process that connects to
//!   the coordinator's port as cluster `c` before the real one can join in its place
//!   (the real cluster `c` is then refused, so the job fails rather than runs with it).
//!   Use a key file where that matters.
//!
//! The run's epoch is a random `u64` that cluster 0 draws at every start and sends in
//! the `Welcome`; every INI datagram carries it, so datagrams of an earlier run are
//! dropped even when a key file is reused.

use std::fmt;
use std::io::{self, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

use multigrain_window::wire::MacKey;

/// Names the file holding the job's secret (a path, never the key itself); set by
/// `multigrain launch` and `multigrain run`, or by the user under `srun`/`mpirun`.
pub const ENV_KEY_FILE: &str = "MULTIGRAIN_KEY_FILE";

/// Bytes of a [`Secret`].
pub const SECRET_LEN: usize = 32;
/// Bytes of a MAC: BLAKE3's keyed hash truncated to 128 bits (a forger's chance per
/// attempt is 2^-128; the full 32 bytes would only make every frame longer) — the INIs'
/// MAC ([`multigrain_window::wire::MacKey`]), which control frames share.
pub use multigrain_window::wire::MAC_LEN;

/// A job's 32-byte secret. `Debug` prints no key bytes.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret([u8; SECRET_LEN]);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

impl Secret {
    /// A fresh secret from the operating system's random source (`getrandom`).
    ///
    /// # Errors
    /// The OS error when no random bytes can be had.
    pub fn generate() -> io::Result<Secret> {
        let mut b = [0u8; SECRET_LEN];
        getrandom::fill(&mut b).map_err(|e| io::Error::other(e.to_string()))?;
        Ok(Secret(b))
    }

    /// A fresh random run epoch (never 0, the value of tests and simulations).
    ///
    /// # Errors
    /// The OS error when no random bytes can be had.
    pub fn random_epoch() -> io::Result<u64> {
        loop {
            let e = getrandom::u64().map_err(|e| io::Error::other(e.to_string()))?;
            if e != 0 {
                return Ok(e);
            }
        }
    }

    /// The secret with these bytes.
    pub const fn from_bytes(bytes: [u8; SECRET_LEN]) -> Secret {
        Secret(bytes)
    }

    /// The key bytes.
    pub const fn as_bytes(&self) -> &[u8; SECRET_LEN] {
        &self.0
    }

    /// The secret as 64 lowercase hex digits (what key files and the bootstrap
    /// `Welcome` carry).
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Parses 64 hex digits (surrounding white space ignored).
    ///
    /// # Errors
    /// A message saying what is wrong (length, a non-hex character); never the input.
    pub fn from_hex(s: &str) -> Result<Secret, String> {
        let s = s.trim();
        if s.len() != 2 * SECRET_LEN {
            return Err(format!(
                "{} characters, expected {} hex digits",
                s.len(),
                2 * SECRET_LEN
            ));
        }
        let mut b = [0u8; SECRET_LEN];
        for (i, out) in b.iter_mut().enumerate() {
            *out = u8::from_str_radix(&s[2 * i..2 * i + 2], 16)
                .map_err(|_| format!("a non-hex character near position {}", 2 * i))?;
        }
        Ok(Secret(b))
    }

    /// The [`MAC_LEN`]-byte MAC of the concatenation of `parts`: BLAKE3 in keyed mode,
    /// as the INIs compute it ([`MacKey`]).
    pub fn mac(&self, parts: &[&[u8]]) -> [u8; MAC_LEN] {
        MacKey::new(self.0).mac_parts(parts)
    }

    /// Whether `tag` is the MAC of `parts`, compared in constant time.
    pub fn verify(&self, parts: &[&[u8]], tag: &[u8]) -> bool {
        MacKey::new(self.0).verify_parts(parts, tag)
    }

    /// Writes the secret as hex into a new file at `path`, created with mode `0600`
    /// (it must not exist: an existing file could be someone else's).
    ///
    /// # Errors
    /// The OS error of creating or writing the file.
    pub fn write_file(&self, path: &Path) -> io::Result<()> {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)?;
        writeln!(f, "{}", self.to_hex())?;
        f.sync_all()
    }

    /// Reads a key file: 64 hex digits, or exactly 32 raw bytes (`head -c 32
    /// /dev/urandom > FILE`). The file must belong to this process's user and be
    /// readable by nobody else (no group or other permission bits).
    ///
    /// # Errors
    /// A message naming the problem (unreadable, wrong owner, too open, malformed);
    /// never the key bytes.
    pub fn read_file(path: &Path) -> Result<Secret, String> {
        let meta = std::fs::metadata(path).map_err(|e| format!("cannot read it: {e}"))?;
        let euid = nix::unistd::geteuid().as_raw();
        if meta.uid() != euid {
            return Err(format!(
                "it belongs to uid {}, not to this process's uid {euid}",
                meta.uid()
            ));
        }
        let mode = meta.mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(format!(
                "its mode is {mode:04o}: others may read it; `chmod 600` it"
            ));
        }
        let bytes = std::fs::read(path).map_err(|e| format!("cannot read it: {e}"))?;
        if bytes.len() == SECRET_LEN {
            let mut b = [0u8; SECRET_LEN];
            b.copy_from_slice(&bytes);
            return Ok(Secret(b));
        }
        let text = std::str::from_utf8(&bytes).map_err(|_| {
            format!(
                "{} bytes that are neither 32 raw bytes nor hex",
                bytes.len()
            )
        })?;
        Secret::from_hex(text)
    }
}

impl serde::Serialize for Secret {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_hex())
    }
}

impl<'de> serde::Deserialize<'de> for Secret {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Secret, D::Error> {
        let s = String::deserialize(d)?;
        Secret::from_hex(&s).map_err(serde::de::Error::custom)
    }
}

/// What a run's members agreed on at registration: the job's secret and the run's epoch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Session {
    /// The job's secret (pre-shared or bootstrapped, see the module docs).
    pub secret: Secret,
    /// The run's random epoch, drawn by cluster 0.
    pub epoch: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trip_and_errors() {
        let s = Secret::generate().unwrap();
        assert_eq!(Secret::from_hex(&s.to_hex()), Ok(s.clone()));
        assert_ne!(Secret::generate().unwrap(), s);
        assert!(
            Secret::from_hex("abc")
                .unwrap_err()
                .contains("3 characters")
        );
        assert!(
            Secret::from_hex(&"zz".repeat(32))
                .unwrap_err()
                .contains("non-hex")
        );
        assert_eq!(format!("{s:?}"), "Secret(<redacted>)");
    }

    #[test]
    fn key_files_must_be_private() {
        let dir = std::env::temp_dir().join(format!("mg-secret-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).unwrap();
        let p = dir.join("key");
        let s = Secret::generate().unwrap();
        s.write_file(&p).unwrap();
        assert_eq!(
            std::fs::metadata(&p).unwrap().mode() & 0o777,
            0o600,
            "created 0600"
        );
        assert_eq!(Secret::read_file(&p), Ok(s.clone()));
        assert!(s.write_file(&p).is_err(), "never overwrites");
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(Secret::read_file(&p).unwrap_err().contains("0644"));
        let raw = dir.join("raw");
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&raw)
            .unwrap()
            .write_all(s.as_bytes())
            .unwrap();
        assert_eq!(Secret::read_file(&raw), Ok(s));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn mac_depends_on_key_and_every_byte() {
        let a = Secret::from_bytes([1; 32]);
        let b = Secret::from_bytes([2; 32]);
        let t = a.mac(&[b"head", b"body"]);
        assert!(a.verify(&[b"headbody"], &t), "parts are concatenated");
        assert!(!b.verify(&[b"head", b"body"], &t));
        assert!(!a.verify(&[b"head", b"bodz"], &t));
        assert!(!a.verify(&[b"head", b"body"], &t[..15]));
    }
}
