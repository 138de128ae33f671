//! Protocol statistics (thesis §4.4.2: per-message counts kept in memory and summarized
//! after the run). Plain counters, updated on the hot path with one add each, and
//! serializable so a JSON report can include them.

use serde::Serialize;

/// Counters of one connection (one local INI ↔ one remote INI). Sizes are in bytes.
///
/// Relations that hold at every instant (checked by the simulation tests):
/// - `data_frames_sent - retransmissions` = distinct sequence numbers used;
/// - datagrams sent on the connection = `data_frames_sent - frames_in_batches_sent +
///   batches_sent + acks_sent + naks_sent` (likewise received);
/// - `data_frames_received = frames_accepted + duplicates + out_of_window`;
/// - once all traffic is acknowledged, the receiver's `frames_accepted` equals the
///   sender's `data_frames_sent - retransmissions`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ConnStats {
    /// Messages accepted by `enqueue`.
    pub msgs_enqueued: u64,
    /// Messages whose every fragment was transmitted at least once.
    pub msgs_sent: u64,
    /// Bytes of the messages counted in `msgs_sent`.
    pub bytes_sent: u64,
    /// Messages whose every fragment was acknowledged.
    pub msgs_acked: u64,
    /// Messages reassembled and delivered to the caller, in order, exactly once.
    pub msgs_delivered: u64,
    /// Bytes of the messages counted in `msgs_delivered`.
    pub bytes_delivered: u64,
    /// DATA frames transmitted, retransmissions included.
    pub data_frames_sent: u64,
    /// DATA frames transmitted again (after a SEND timeout or a NAK).
    pub retransmissions: u64,
    /// SEND timer expiries of unacknowledged frames (thesis §3.2.1).
    pub send_timeouts: u64,
    /// Round-trip samples taken for the adaptive retransmission timeout
    /// ([`crate::WindowConfig::adaptive_timeout`]).
    pub rtt_samples: u64,
    /// Times a SEND timer expiry doubled the adaptive retransmission timeout.
    pub rto_backoffs: u64,
    /// Standalone ACK frames sent (ACK timer expiry, `ack_every`, or a duplicate seen).
    pub acks_sent: u64,
    /// NAK frames sent, one per sequence-number gap found.
    pub naks_sent: u64,
    /// BATCH datagrams sent (several new DATA frames in one datagram,
    /// [`crate::WindowConfig::coalesce`]).
    pub batches_sent: u64,
    /// DATA frames sent inside BATCH datagrams (also counted in `data_frames_sent`).
    pub frames_in_batches_sent: u64,
    /// DATA frames received for this connection (after the address, epoch and tag checks).
    pub data_frames_received: u64,
    /// DATA frames accepted into the receive window (each sequence number once).
    pub frames_accepted: u64,
    /// Standalone ACK frames received.
    pub acks_received: u64,
    /// NAK frames received.
    pub naks_received: u64,
    /// BATCH datagrams received (after the address, epoch and tag checks).
    pub batches_received: u64,
    /// DATA frames received inside BATCH datagrams (also counted in
    /// `data_frames_received`).
    pub frames_in_batches_received: u64,
    /// DATA frames rejected because that sequence number was already received.
    pub duplicates: u64,
    /// DATA frames rejected because their sequence number was outside the window.
    pub out_of_window: u64,
    /// Frames whose fragment fields did not continue the message being reassembled; the
    /// partial message is discarded (only a faulty or hostile peer causes this).
    pub reassembly_errors: u64,
}

impl ConnStats {
    /// Adds every counter of `other` to `self`.
    pub fn accumulate(&mut self, other: &ConnStats) {
        let ConnStats {
            msgs_enqueued,
            msgs_sent,
            bytes_sent,
            msgs_acked,
            msgs_delivered,
            bytes_delivered,
            data_frames_sent,
            retransmissions,
            send_timeouts,
            rtt_samples,
            rto_backoffs,
            acks_sent,
            naks_sent,
            batches_sent,
            frames_in_batches_sent,
            data_frames_received,
            frames_accepted,
            acks_received,
            naks_received,
            batches_received,
            frames_in_batches_received,
            duplicates,
            out_of_window,
            reassembly_errors,
        } = other;
        self.msgs_enqueued += msgs_enqueued;
        self.msgs_sent += msgs_sent;
        self.bytes_sent += bytes_sent;
        self.msgs_acked += msgs_acked;
        self.msgs_delivered += msgs_delivered;
        self.bytes_delivered += bytes_delivered;
        self.data_frames_sent += data_frames_sent;
        self.retransmissions += retransmissions;
        self.send_timeouts += send_timeouts;
        self.rtt_samples += rtt_samples;
        self.rto_backoffs += rto_backoffs;
        self.acks_sent += acks_sent;
        self.naks_sent += naks_sent;
        self.batches_sent += batches_sent;
        self.frames_in_batches_sent += frames_in_batches_sent;
        self.data_frames_received += data_frames_received;
        self.frames_accepted += frames_accepted;
        self.acks_received += acks_received;
        self.naks_received += naks_received;
        self.batches_received += batches_received;
        self.frames_in_batches_received += frames_in_batches_received;
        self.duplicates += duplicates;
        self.out_of_window += out_of_window;
        self.reassembly_errors += reassembly_errors;
    }
}

/// Counters of one INI: datagram-level rejections plus the sum over its connections.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct IniStats {
    /// Datagrams handed to the caller by `poll_transmit`.
    pub datagrams_sent: u64,
    /// Bytes of those datagrams.
    pub datagram_bytes_sent: u64,
    /// Datagrams given to `handle_datagram`.
    pub datagrams_received: u64,
    /// Bytes of those datagrams.
    pub datagram_bytes_received: u64,
    /// Datagrams dropped because their tag does not authenticate them under the run's
    /// key: corrupted in transit or forged (the AES-GCM tag replaces the CRC32C checksum
    /// of thesis §3.1 and catches corruption at least as reliably).
    pub bad_mac: u64,
    /// Malformed datagrams: any other decode error (length, magic, version, kind,
    /// fragment fields).
    pub decode_failures: u64,
    /// Datagrams carrying another run's epoch: replays of an earlier run, or another
    /// job sharing the ports.
    pub wrong_epoch: u64,
    /// Datagrams whose source address is not the registered address of a peer INI (or
    /// of the INI the authenticated header names).
    pub unknown_source: u64,
    /// Datagrams addressed to another INI.
    pub misdirected: u64,
    /// Datagrams from an INI this one has no connection to.
    pub unknown_peer: u64,
    /// Sum of the counters of every connection.
    pub connections: ConnStats,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accumulate_adds_every_field() {
        let one = ConnStats {
            msgs_enqueued: 1,
            msgs_sent: 2,
            bytes_sent: 3,
            msgs_acked: 4,
            msgs_delivered: 5,
            bytes_delivered: 6,
            data_frames_sent: 7,
            retransmissions: 8,
            send_timeouts: 9,
            rtt_samples: 23,
            rto_backoffs: 24,
            acks_sent: 10,
            naks_sent: 11,
            batches_sent: 19,
            frames_in_batches_sent: 20,
            data_frames_received: 12,
            frames_accepted: 13,
            acks_received: 14,
            naks_received: 15,
            batches_received: 21,
            frames_in_batches_received: 22,
            duplicates: 16,
            out_of_window: 17,
            reassembly_errors: 18,
        };
        let mut sum = one;
        sum.accumulate(&one);
        let ConnStats {
            msgs_enqueued,
            reassembly_errors,
            naks_sent,
            frames_in_batches_received,
            ..
        } = sum;
        assert_eq!(
            (
                msgs_enqueued,
                naks_sent,
                reassembly_errors,
                frames_in_batches_received
            ),
            (2, 22, 36, 44)
        );
        let mut zero = ConnStats::default();
        zero.accumulate(&one);
        assert_eq!(zero, one);
    }

    #[test]
    fn stats_serialize_to_json_with_field_names() {
        let s = IniStats {
            bad_mac: 3,
            connections: ConnStats {
                retransmissions: 7,
                ..ConnStats::default()
            },
            ..IniStats::default()
        };
        let v: serde_json::Value = serde_json::to_value(s).unwrap();
        assert_eq!(v["bad_mac"], 3);
        assert_eq!(v["connections"]["retransmissions"], 7);
        assert_eq!(v["connections"]["duplicates"], 0);
        assert_eq!(v.as_object().unwrap().len(), 11);
        assert_eq!(v["connections"].as_object().unwrap().len(), 24);
    }
}
