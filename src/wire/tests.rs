//! Unit tests of the codec: one per framing rule, plus round trips.

use super::*;

fn server(line: &str) -> Result<String, FrameError> {
    ServerFrame::parse(line.as_bytes()).map(|f| f.to_string())
}

fn client(line: &str) -> Result<String, FrameError> {
    ClientFrame::parse(line.as_bytes()).map(|f| f.to_string())
}

#[test]
fn every_valid_frame_round_trips_byte_for_byte() {
    let long_key = "k".repeat(250);
    let max = u64::MAX.to_string();
    for line in [
        "W node-1 2".to_string(),
        format!("W n {max}"),
        "M 10.0.0.2:7878".into(),
        "L [::1]:1".into(),
        "E no_leader".into(),
        "E something_else".into(),
        format!("G 0 A {long_key} 0 1"),
        format!("G {max} A k {max} {max}"),
        "T 1 A k".into(),
        "B 2 A k".into(),
        "D 3 R k".into(),
        "N 4 R !~".into(),
        // Version 2.
        format!("G 5 A k 7 30000 {max}"),
        "G 6 A k 7 30000 0".into(),
        format!("G {max} X k {max} 1"),
        "N 8 X k".into(),
    ] {
        assert_eq!(server(&line).as_deref(), Ok(line.as_str()));
    }
    assert_eq!(
        ServerFrame::parse(b"G 5 A k 7 30000 12"),
        Ok(ServerFrame::Answer(Answer {
            id: 5,
            key: Atom::new("k").unwrap(),
            kind: AnswerKind::Granted {
                token: 7,
                lease_ms: core::num::NonZeroU64::new(30000).unwrap(),
                waited_ms: Some(12),
            }
        }))
    );
    assert_eq!(
        ServerFrame::parse(b"G 6 X k 7 30000"),
        Ok(ServerFrame::Answer(Answer {
            id: 6,
            key: Atom::new("k").unwrap(),
            kind: AnswerKind::Renewed {
                token: 7,
                lease_ms: core::num::NonZeroU64::new(30000).unwrap(),
            }
        }))
    );
    for line in [
        "H 1 client-a -".to_string(),
        "H 7 c secret".into(),
        format!("A {max} k o 0 {max}"),
        "A 1 k o 5000 1".into(),
        "R 9 k 0".into(),
        "H 2 c -".into(),
        format!("X {max} k {max} {max}"),
        "X 1 k 0 1".into(),
    ] {
        assert_eq!(client(&line).as_deref(), Ok(line.as_str()));
    }
}

#[test]
fn encode_ends_in_a_single_newline() {
    let frame = ServerFrame::parse(b"T 1 A k").unwrap();
    let mut out = Vec::new();
    frame.encode(&mut out);
    assert_eq!(out, b"T 1 A k\n");
}

#[test]
fn framing_rule_empty_line() {
    assert_eq!(server(""), Err(FrameError::EmptyLine));
}

#[test]
fn framing_rule_single_spaces_no_leading_or_trailing() {
    assert_eq!(server(" T 1 A k"), Err(FrameError::EmptyField { index: 0 }));
    assert_eq!(server("T 1 A k "), Err(FrameError::EmptyField { index: 4 }));
    assert_eq!(server("T 1  A k"), Err(FrameError::EmptyField { index: 2 }));
    assert_eq!(server(" "), Err(FrameError::EmptyField { index: 0 }));
    // Past the frame's last field too.
    assert_eq!(
        server("T 1 A k  x"),
        Err(FrameError::EmptyField { index: 4 })
    );
    assert_eq!(
        server("T 1 A k x "),
        Err(FrameError::EmptyField { index: 5 })
    );
}

#[test]
fn a_line_with_several_faults_is_reported_by_the_first_from_the_left() {
    assert_eq!(
        server("T 01 A k x"),
        Err(FrameError::LeadingZero { field: "id" })
    );
    assert_eq!(
        server("G 1 A k x"),
        Err(FrameError::NotANumber { field: "token" })
    );
    assert_eq!(
        server("T 1x\r A k"),
        Err(FrameError::NotANumber { field: "id" })
    );
    assert_eq!(
        server("X 1\r"),
        Err(FrameError::UnknownKind { kind: "X".into() })
    );
    assert_eq!(
        server("T 1 A k 5\r"),
        Err(FrameError::CarriageReturn { at: 9 })
    );
    // Values are judged once every field is read.
    assert_eq!(
        server("W n 1 x"),
        Err(FrameError::FieldCount {
            kind: 'W',
            expected: 3,
            found: 4
        })
    );
    assert_eq!(server("G 1 R k 5 0"), Err(FrameError::ZeroLease));
}

#[test]
fn framing_rule_no_carriage_return() {
    assert_eq!(
        server("T 1 A k\r"),
        Err(FrameError::CarriageReturn { at: 7 })
    );
    assert_eq!(
        server("T 1\r A k"),
        Err(FrameError::CarriageReturn { at: 3 })
    );
}

#[test]
fn framing_rule_printable_ascii_only() {
    assert_eq!(
        server("T 1 A k\u{7f}"),
        Err(FrameError::InvalidByte { at: 7, byte: 0x7f })
    );
    assert_eq!(
        server("T\t1 A k"),
        Err(FrameError::InvalidByte { at: 1, byte: b'\t' })
    );
    assert_eq!(
        ServerFrame::parse(b"T 1 A \xc3\xa9"),
        Err(FrameError::InvalidByte { at: 6, byte: 0xc3 })
    );
    assert_eq!(
        ServerFrame::parse(b"T 1 A \0"),
        Err(FrameError::InvalidByte { at: 6, byte: 0 })
    );
}

#[test]
fn framing_rule_atom_length() {
    let key = "k".repeat(251);
    assert_eq!(
        server(&format!("T 1 A {key}")),
        Err(FrameError::AtomTooLong {
            field: "key",
            len: 251
        })
    );
    assert_eq!(
        client(&format!("H 1 {key} -")),
        Err(FrameError::AtomTooLong {
            field: "client_id",
            len: 251
        })
    );
}

#[test]
fn framing_rule_canonical_numbers() {
    assert_eq!(
        server("T 01 A k"),
        Err(FrameError::LeadingZero { field: "id" })
    );
    assert_eq!(
        server("T 00 A k"),
        Err(FrameError::LeadingZero { field: "id" })
    );
    assert_eq!(
        server("T +1 A k"),
        Err(FrameError::NotANumber { field: "id" })
    );
    assert_eq!(
        server("T -1 A k"),
        Err(FrameError::NotANumber { field: "id" })
    );
    assert_eq!(
        server("T 1x A k"),
        Err(FrameError::NotANumber { field: "id" })
    );
    assert_eq!(
        server("G 1 A k 7 1e3"),
        Err(FrameError::NotANumber { field: "lease_ms" })
    );
    assert_eq!(
        client("A 1 k o 007 5"),
        Err(FrameError::LeadingZero { field: "wait_ms" })
    );
}

#[test]
fn framing_rule_u64_overflow() {
    assert_eq!(
        server("T 18446744073709551616 A k"),
        Err(FrameError::Overflow { field: "id" })
    );
    assert_eq!(
        server("G 1 A k 99999999999999999999 5"),
        Err(FrameError::Overflow { field: "token" })
    );
    assert!(server("T 18446744073709551615 A k").is_ok());
}

#[test]
fn framing_rule_field_counts() {
    for (line, kind, expected, found) in [
        ("W n", 'W', 3, 2),
        ("W n 2 x", 'W', 3, 4),
        ("M", 'M', 2, 1),
        ("L a:1 b:2", 'L', 2, 3),
        ("E", 'E', 2, 1),
        ("E a b", 'E', 2, 3),
        ("G 1 A k 5", 'G', 6, 5),
        ("G 1 X k 5 5 5", 'G', 6, 7),
        ("G 1 A k 5 5 5 5", 'G', 7, 8),
        ("N 1 X k 5", 'N', 4, 5),
        ("T 1 A", 'T', 4, 3),
        ("B 1 A k x", 'B', 4, 5),
        ("D 1 R", 'D', 4, 3),
        ("N 1 R k 5", 'N', 4, 5),
        ("G 1 A k 5 5 5 5 5 5 5 5", 'G', 7, 8),
    ] {
        assert_eq!(
            server(line),
            Err(FrameError::FieldCount {
                kind,
                expected,
                found
            }),
            "{line}"
        );
    }
    assert_eq!(
        client("A 1 k o 5"),
        Err(FrameError::FieldCount {
            kind: 'A',
            expected: 6,
            found: 5
        })
    );
    assert_eq!(
        client("X 1 k 5"),
        Err(FrameError::FieldCount {
            kind: 'X',
            expected: 5,
            found: 4
        })
    );
}

#[test]
fn framing_rule_unknown_kind() {
    assert_eq!(
        server("X 1 A k"),
        Err(FrameError::UnknownKind { kind: "X".into() })
    );
    assert_eq!(
        server("GG 1 A k 1 1"),
        Err(FrameError::UnknownKind { kind: "GG".into() })
    );
    // A client frame is of an unknown kind for a client, and vice versa.
    assert_eq!(
        server("A 1 k o 0 1"),
        Err(FrameError::UnknownKind { kind: "A".into() })
    );
    assert_eq!(
        client("G 1 A k 1 1"),
        Err(FrameError::UnknownKind { kind: "G".into() })
    );
    let long = "Z".repeat(40);
    assert_eq!(
        server(&long),
        Err(FrameError::UnknownKind {
            kind: "Z".repeat(16)
        })
    );
}

#[test]
fn framing_rule_kind_op_pairings() {
    for (line, kind, op) in [
        ("G 1 R k 5 5", 'G', 'R'),
        ("T 1 R k", 'T', 'R'),
        ("B 1 R k", 'B', 'R'),
        ("D 1 A k", 'D', 'A'),
        ("N 1 A k", 'N', 'A'),
    ] {
        assert_eq!(
            server(line),
            Err(FrameError::BadPairing { kind, op }),
            "{line}"
        );
    }
    for (line, kind, op) in [
        ("T 1 X k", 'T', 'X'),
        ("B 1 X k", 'B', 'X'),
        ("D 1 X k", 'D', 'X'),
    ] {
        assert_eq!(
            server(line),
            Err(FrameError::BadPairing { kind, op }),
            "{line}"
        );
    }
    assert_eq!(server("T 1 Y k"), Err(FrameError::BadOp));
    assert_eq!(server("T 1 AR k"), Err(FrameError::BadOp));
}

#[test]
fn framing_rule_lease_and_window_minimums() {
    assert_eq!(server("G 1 A k 5 0"), Err(FrameError::ZeroLease));
    assert_eq!(server("G 1 A k 5 0 0"), Err(FrameError::ZeroLease));
    assert_eq!(server("G 1 X k 5 0"), Err(FrameError::ZeroLease));
    assert_eq!(client("A 1 k o 5 0"), Err(FrameError::ZeroLease));
    assert_eq!(client("X 1 k 5 0"), Err(FrameError::ZeroLease));
    assert_eq!(
        server("W n 1"),
        Err(FrameError::WindowTooSmall { window: 1 })
    );
    assert_eq!(
        server("W n 0"),
        Err(FrameError::WindowTooSmall { window: 0 })
    );
}

#[test]
fn framing_rule_addresses() {
    assert_eq!(
        server("M nowhere"),
        Err(FrameError::BadAddress { field: "addr" })
    );
    assert_eq!(
        server("L h:99999"),
        Err(FrameError::BadAddress { field: "addr" })
    );
}

#[test]
fn line_reader_accepts_exactly_1024_bytes_and_fails_at_byte_1025() {
    // 1023 bytes and the newline: the longest legal frame.
    let reason = "e".repeat(1021);
    let ok = format!("E {reason}\n");
    assert_eq!(ok.len(), MAX_FRAME);
    let mut r = LineReader::new();
    let mut input = ok.as_bytes();
    assert_eq!(r.next_line(&mut input).unwrap().unwrap().len(), 1023);

    // 1024 bytes without a newline are still buffered: no error yet.
    let mut r = LineReader::new();
    let body = vec![b'x'; 1024];
    let mut input = &body[..];
    assert!(r.next_line(&mut input).is_none());
    assert_eq!(r.buffered(), 1024);
    // Byte 1025 fails at once, whatever it is, even a newline.
    let mut input = &b"\n"[..];
    assert_eq!(r.next_line(&mut input), Some(Err(FrameError::LineTooLong)));
    // And the reader stays failed.
    let mut input = &b"T 1 A k\n"[..];
    assert_eq!(r.next_line(&mut input), Some(Err(FrameError::LineTooLong)));
    assert_eq!(r.buffered(), 0);
}

#[test]
fn line_reader_fails_on_byte_1025_across_many_chunks() {
    let mut r = LineReader::new();
    for _ in 0..1024 {
        let mut input = &b"y"[..];
        assert!(r.next_line(&mut input).is_none());
    }
    let mut input = &b"y"[..];
    assert_eq!(r.next_line(&mut input), Some(Err(FrameError::LineTooLong)));
}

#[test]
fn line_reader_joins_lines_split_anywhere() {
    let stream = b"W n 4\nG 1 A k 2 3\nT 22 A key\n";
    for cut in 0..=stream.len() {
        let mut r = LineReader::new();
        let mut got = Vec::new();
        for chunk in [&stream[..cut], &stream[cut..]] {
            let mut input = chunk;
            while let Some(line) = r.next_line(&mut input) {
                got.push(line.unwrap().to_vec());
            }
        }
        assert_eq!(
            got,
            vec![
                b"W n 4".to_vec(),
                b"G 1 A k 2 3".to_vec(),
                b"T 22 A key".to_vec()
            ],
            "cut at {cut}"
        );
        assert_eq!(r.buffered(), 0);
    }
}

/// What a reader makes of a stream cut into chunks when good lines whole in
/// a chunk are taken a batch at a time (as the client reads) is what it
/// makes of it one line at a time: the same frames and faults, in order,
/// and the same bytes buffered.
#[test]
fn frames_read_a_batch_at_a_time_are_the_lines_read_one_at_a_time() {
    let mut rng = crate::rng::Rng::new(5);
    let lines: [&[u8]; 6] = [
        b"G 1 A k 2 3\n",
        b"D 22 R key\n",
        b"W n 4\n",
        b"G 3 X k 9 1\n",
        b"B 07 A k\n",
        b"T 5 A k\r\n",
    ];
    for _ in 0..300 {
        let mut stream = Vec::new();
        for _ in 0..rng.up_to(60) {
            // Mostly good lines, so that batches fill.
            let line = lines[(rng.up_to(9) as usize).min(5) * usize::from(rng.chance(1, 2))];
            stream.extend_from_slice(line);
        }
        let cuts: Vec<usize> = {
            let mut cuts: Vec<usize> = (0..rng.up_to(4))
                .map(|_| rng.up_to(stream.len() as u64) as usize)
                .collect();
            cuts.push(stream.len());
            cuts.sort_unstable();
            cuts
        };
        let read = |batches: bool| {
            let mut reader = LineReader::new();
            let mut got: Vec<Result<String, FrameError>> = Vec::new();
            let mut start = 0;
            let mut buffered = Vec::new();
            for &cut in &cuts {
                let mut input = &stream[start..cut];
                start = cut;
                loop {
                    if batches {
                        let frames = reader.leading_frames(&mut input);
                        if !frames.is_empty() {
                            assert!(frames.as_slice().len() <= super::line::BATCH);
                            got.extend(frames.as_slice().iter().map(|f| Ok(f.to_string())));
                            continue;
                        }
                    }
                    match reader.next_line(&mut input) {
                        Some(line) => {
                            got.push(line.and_then(ServerFrame::parse).map(|f| f.to_string()))
                        }
                        None => break,
                    }
                }
                buffered.push(reader.buffered());
            }
            (got, buffered)
        };
        assert_eq!(read(true), read(false));
    }
}
