use super::*;
use std::path::Path;

fn sample() -> Profile {
    Profile {
        schema: SCHEMA,
        witch_version: "test".into(),
        craft: Craft::Dead,
        program: "/bin/true".into(),
        args: vec![],
        pid: 1,
        ppid: 0,
        start_unix_ns: 0,
        duration_ns: 1,
        sampler: SamplerSettings {
            kind: SamplerKind::Software,
            event: "task-clock".into(),
            period: 1000,
            unit: PeriodUnit::Ns,
            ..Default::default()
        },
        replacement: "reservoir".into(),
        debug_registers: 4,
        fp_precision: 0.01,
        kernel: "6".into(),
        ended_by: EndedBy::Exit,
        exec_call: None,
        round_trips: None,
        notes: vec![],
        counters: Counters::default(),
        modules: vec![],
        threads: vec![Thread {
            tid: 1,
            nodes: vec![
                Node { parent: 0, pc: 0, samples: 0 },
                Node { parent: 0, pc: 10, samples: 3 },
                Node { parent: 1, pc: 20, samples: 1 },
            ],
            pairs: vec![Pair { watch: 2, trap: 1, waste: 30.0, approx_waste: 10.0, r#use: 60.0, traps: 3, ..Default::default() }],
            counters: Counters::default(),
            clusters: Clustered { clusters: 2, waste_sq: 1600.0, use_sq: 3600.0, waste_use: 0.0 },
            objects: vec![ObjectPair {
                pair: Pair { watch: 2, trap: 1, waste: 30.0, traps: 1, ..Default::default() },
                object: DataRef::Address { addr: 0x4000 },
            }],
        }],
        processes: vec![],
    }
}

#[test]
fn ended_by_is_one_word_as_before() {
    let all = [EndedBy::Exit, EndedBy::Signal(6), EndedBy::Exec, EndedBy::Detach, EndedBy::Traced, EndedBy::Sandbox];
    for e in all {
        let json = serde_json::to_string(&e).unwrap();
        assert_eq!(serde_json::from_str::<EndedBy>(&json).unwrap(), e, "{json}");
    }
    assert_eq!(serde_json::to_string(&EndedBy::Signal(9)).unwrap(), r#""signal 9""#);
    for bad in [r#""crashed""#, r#""signal""#, r#""signal 0""#, r#""signal -3""#, "7"] {
        assert!(serde_json::from_str::<EndedBy>(bad).is_err(), "{bad}");
    }
    assert!(EndedBy::Exec.process_runs_on() && !EndedBy::Signal(9).process_runs_on());
    assert!(EndedBy::Sandbox.agent_left() && !EndedBy::Detach.agent_left());
}

#[test]
fn roundtrip_and_fraction() {
    let p = sample();
    let dir = std::env::temp_dir().join(format!("witch-prof-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let f = dir.join("p.json");
    p.save(&f).unwrap();
    let q = Profile::load(&f).unwrap();
    assert_eq!(p, q);
    assert!((q.waste_fraction() - 0.4).abs() < 1e-12);
    assert_eq!(Profile::context(&q.threads[0], 2), vec![20, 10]);
}

#[test]
fn bad_inputs_are_errors() {
    assert!(matches!(Profile::from_bytes(b""), Err(LoadError::Empty)));
    // Endless or binary input fails at its first bytes, bounded.
    let zeros = std::io::Read::take(std::io::repeat(0), 1 << 40);
    assert!(matches!(read_capped(zeros, 1 << 30, |h| if h[0] == 0 { Err("NUL".into()) } else { Ok(()) }), Err(Capped::Refused(_))));
    let braces = std::io::Read::take(std::io::repeat(b'{'), 1 << 40);
    assert!(matches!(read_capped(braces, 1 << 20, |_| Ok(())), Err(Capped::TooLarge)));
    assert_eq!(read_capped(&b" {}"[..], 3, |_| Ok(())).unwrap(), b" {}");
    match Profile::load(Path::new("/dev/zero")) {
        Err(LoadError::NotProfile(why)) => assert!(why.contains("0x00"), "{why}"),
        other => panic!("/dev/zero: {other:?}"),
    }
    // Garbage that begins like a JSON object (random bytes do, one time
    // in about fifty: `{` or whitespace first) is refused at its first
    // control byte, not read to the limit.
    let dir = std::env::temp_dir().join(format!("witch-profile-text-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let looks_like = dir.join("brace.json");
    let mut junk = b"{ \"schema\": 2, ".to_vec();
    junk.extend((0..1u32 << 20).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8));
    std::fs::write(&looks_like, &junk).unwrap();
    match Profile::load(&looks_like) {
        Err(LoadError::NotProfile(why)) => assert!(why.contains("binary data") && why.contains("offset"), "{why}"),
        other => panic!("{}: {other:?}", looks_like.display()),
    }
    // Tabs, newlines and carriage returns are text.
    let crlf = dir.join("crlf.json");
    std::fs::write(&crlf, serde_json::to_string_pretty(&sample()).unwrap().replace('\n', "\r\n\t")).unwrap();
    assert_eq!(Profile::load(&crlf).unwrap(), sample());
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(matches!(Profile::from_bytes(b"{\"schema\":1,"), Err(LoadError::Corrupt(_))));
    let mut v = serde_json::to_value(sample()).unwrap();
    v["schema"] = 99.into();
    assert!(matches!(Profile::from_bytes(v.to_string().as_bytes()), Err(LoadError::Newer(99))));
    let mut p = sample();
    p.threads[0].pairs[0].trap = 7;
    let s = serde_json::to_vec(&p).unwrap();
    assert!(matches!(Profile::from_bytes(&s), Err(LoadError::Corrupt(_))));
    // An object entry is checked like a pair.
    let mut p = sample();
    p.threads[0].objects[0].pair.trap = 7;
    assert!(matches!(Profile::from_bytes(&serde_json::to_vec(&p).unwrap()), Err(LoadError::Corrupt(_))));
    let mut p = sample();
    p.threads[0].objects[0].pair.waste = f64::NAN;
    assert!(matches!(Profile::from_bytes(&serde_json::to_vec(&p).unwrap()), Err(LoadError::Corrupt(_))));
    let mut v = serde_json::to_value(sample()).unwrap();
    v["threads"][0]["objects"][0]["object"] = serde_json::json!({"kind": "moon"});
    assert!(matches!(Profile::from_bytes(v.to_string().as_bytes()), Err(LoadError::Corrupt(_))));
    let mut p = sample();
    p.threads[0].pairs[0].waste = -5.0;
    assert!(matches!(Profile::from_bytes(&serde_json::to_vec(&p).unwrap()), Err(LoadError::Corrupt(_))));
    let mut p = sample();
    p.threads[0].pairs[0].cluster.use_sq = -1.0;
    p.threads[0].pairs[0].cluster.clusters = 1;
    assert!(matches!(Profile::from_bytes(&serde_json::to_vec(&p).unwrap()), Err(LoadError::Corrupt(_))));
    let mut p = sample();
    p.threads[0].clusters.waste_use = -1.0;
    assert!(matches!(Profile::from_bytes(&serde_json::to_vec(&p).unwrap()), Err(LoadError::Corrupt(_))));
    // A broken child section is as corrupt as a broken top level.
    let mut p = sample();
    let mut child = sample();
    child.threads[0].pairs[0].watch = 9;
    p.processes.push(child);
    assert!(matches!(Profile::from_bytes(&serde_json::to_vec(&p).unwrap()), Err(LoadError::Corrupt(_))));
    let mut p = sample();
    let mut child = sample();
    child.processes.push(sample());
    p.processes.push(child);
    assert!(matches!(Profile::from_bytes(&serde_json::to_vec(&p).unwrap()), Err(LoadError::Corrupt(_))));
}

#[test]
fn units_are_typed_and_read_from_older_files() {
    let mut v = serde_json::to_value(sample()).unwrap();
    assert_eq!(v["sampler"]["kind"], "software");
    assert_eq!(v["sampler"]["unit"], "ns");
    assert!(v["sampler"].get("weight_unit").is_none() && v.get("processes").is_none());
    let p = Profile::from_bytes(v.to_string().as_bytes()).unwrap();
    assert_eq!(p.value_unit(), ValueUnit::ByteNs);
    v["sampler"]["unit"] = "stores".into();
    assert_eq!(Profile::from_bytes(v.to_string().as_bytes()).unwrap().value_unit(), ValueUnit::Bytes);
    // As the engine writes it, and as profiles of an interim format did ("").
    for (w, want) in [("byte·ns", ValueUnit::ByteNs), ("bytes", ValueUnit::Bytes), ("", ValueUnit::Bytes)] {
        v["sampler"]["weight_unit"] = w.into();
        assert_eq!(Profile::from_bytes(v.to_string().as_bytes()).unwrap().value_unit(), want, "{w:?}");
    }
    let mut p = sample();
    p.sampler.weight_unit = Some(ValueUnit::ByteNs);
    assert_eq!(serde_json::to_value(&p).unwrap()["sampler"]["weight_unit"], "byte·ns");
    // Profiles from before data objects load without them; the entries
    // are written flat, the object beside the pair's fields.
    assert_eq!(v["threads"][0]["objects"][0]["object"], serde_json::json!({"kind": "address", "addr": 0x4000}));
    assert_eq!(v["threads"][0]["objects"][0]["watch"], 2);
    v["threads"][0].as_object_mut().unwrap().remove("objects");
    assert!(Profile::from_bytes(v.to_string().as_bytes()).unwrap().threads[0].objects.is_empty());
    v["sampler"]["kind"] = "sundial".into();
    assert!(matches!(Profile::from_bytes(v.to_string().as_bytes()), Err(LoadError::Corrupt(_))));
}
