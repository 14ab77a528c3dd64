//! The browser dialect of the shaders: `enable subgroups;` is prepended where subgroup builtins
//! are used (browsers require it; naga 30 rejects it), and nothing else changes; and a check for
//! WGSL that naga accepts but browsers reject.

use qsa_wgpu::shaders::{self, ShaderTarget};

/// A reduction over one subgroup; naga reads it without an enable directive.
const SUBGROUP_SUM: &str = "
@group(0) @binding(0) var<storage, read_write> data: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>,
        @builtin(subgroup_invocation_id) lane: u32) {
    let s = subgroupAdd(data[gid.x]);
    if lane == 0u {
        data[gid.x] = s;
    }
}
";

fn naga_accepts(src: &str) -> Result<(), String> {
    let module = naga::front::wgsl::parse_str(src).map_err(|e| e.emit_to_string(src))?;
    naga::valid::Validator::new(
        naga::valid::ValidationFlags::all(),
        naga::valid::Capabilities::SUBGROUP,
    )
    .subgroup_stages(naga::valid::ShaderStages::COMPUTE)
    .subgroup_operations(naga::valid::SubgroupOperationSet::all())
    .validate(&module)
    .map_err(|e| format!("{e:?}"))?;
    Ok(())
}

#[test]
fn browser_dialect_enables_subgroups_where_used() {
    naga_accepts(SUBGROUP_SUM).unwrap();
    let naga_src = shaders::for_target(SUBGROUP_SUM.to_string(), ShaderTarget::Naga);
    assert_eq!(naga_src, SUBGROUP_SUM);
    let web = shaders::for_target(SUBGROUP_SUM.to_string(), ShaderTarget::Browser);
    assert_eq!(web, format!("enable subgroups;\n{SUBGROUP_SUM}"));
    // Why the dialects differ: if naga starts accepting the directive, this difference can go.
    assert!(
        naga_accepts(&web).is_err(),
        "naga now accepts `enable subgroups;`"
    );
    // Applied once only.
    assert_eq!(shaders::for_target(web.clone(), ShaderTarget::Browser), web);
}

#[test]
fn subgroup_use_is_found_in_code_not_in_comments() {
    assert!(shaders::uses_subgroups(
        "let x = subgroupBroadcastFirst(v);"
    ));
    assert!(shaders::uses_subgroups("@builtin(subgroup_size) n: u32"));
    assert!(shaders::uses_subgroups("let y = quadSwapX(v);"));
    assert!(!shaders::uses_subgroups(
        "// a subgroupAdd here would need the extension"
    ));
    assert!(!shaders::uses_subgroups(
        "let quadrant = 1u; let my_subgroupish = 2u;"
    ));
}

#[test]
fn browser_dialect_only_enables_subgroups() {
    // The browser's copy of an operator shader is naga's, with `enable subgroups;` in front
    // exactly when it uses subgroups (the subgroup variants; the browser build never picks
    // them, but the pipeline cache may still be asked to build one).
    let mut with = Vec::new();
    for name in shaders::operators() {
        let naga_src = shaders::assemble(name).unwrap();
        let web = shaders::assemble_for(name, ShaderTarget::Browser).unwrap();
        if shaders::uses_subgroups(&naga_src) {
            with.push(name);
            assert_eq!(web, format!("enable subgroups;\n{naga_src}"), "{name}");
        } else {
            assert_eq!(web, naga_src, "{name}: the browser dialect differs");
        }
    }
    assert_eq!(
        with,
        [
            "block_topk_sg",
            "block_score_tex_sg",
            "nsa_compress_attention_sg",
            "nsa_compress_attention_sg_w32",
            "nsa_compress_attention_sg_tex",
            "nsa_compress_attention_values_sg",
            "nsa_compress_attention_values_sg_w32",
            "nsa_compress_attention_values_sg_tex",
            "sparse_attention_sg",
            "sparse_attention_sg_w32",
            "sparse_attention_route_sg"
        ]
    );
}

#[test]
fn int64_use_is_found_in_code_not_in_comments() {
    assert!(shaders::uses_int64(
        "@group(0) @binding(6) var<storage, read> key8: array<vec4<u64>>;"
    ));
    assert!(shaders::uses_int64("let x: i64 = 0li;"));
    assert!(!shaders::uses_int64("// vec4<u64> words, 32 bytes a load"));
    assert!(!shaders::uses_int64("let u64s = 1u; let key_u64 = 2u;"));
}

#[test]
fn only_the_32_byte_word_variants_need_64_bit_integers() {
    // They are chosen only where the device has SHADER_INT64 (Capabilities::wide_loads);
    // any other shader must build on every device, the browser's included.
    let with: Vec<&str> = shaders::operators()
        .filter(|name| shaders::uses_int64(&shaders::assemble(name).unwrap()))
        .collect();
    assert_eq!(
        with,
        [
            "nsa_compress_attention_sg_w32",
            "nsa_compress_attention_values_sg_w32",
            "sparse_attention_sg_w32"
        ]
    );
}

/// WGSL makes a constant expression that evaluates to an infinity or NaN a shader-creation
/// error. Browsers enforce it; naga does not, so it is checked here for the one form such a
/// constant takes in these shaders: `bitcast<f32>(<literal>)` with all exponent bits set.
#[test]
fn no_constant_expression_is_an_infinity_or_nan() {
    let mut bad = Vec::new();
    for name in shaders::operators() {
        let src = shaders::assemble(name).unwrap();
        for (i, line) in src.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            for part in code.split("bitcast<f32>(").skip(1) {
                let arg = part.split(')').next().unwrap_or("").trim();
                let Some(hex) = arg.strip_prefix("0x").and_then(|h| h.strip_suffix('u')) else {
                    continue;
                };
                let bits = u32::from_str_radix(hex, 16).unwrap_or(0);
                if bits & 0x7f80_0000 == 0x7f80_0000 {
                    bad.push(format!("{name}:{}: {}", i + 1, line.trim()));
                }
            }
        }
    }
    assert!(
        bad.is_empty(),
        "constant infinities or NaNs:\n{}",
        bad.join("\n")
    );
}

/// Every function-scope `var` has an initializer. WGSL zero-initialises `var x: T;` each time
/// the declaration runs, but a browser compiler (Tint on SwiftShader) was seen to keep the
/// values of such a variable from the previous iteration of the loop that declares it; naga
/// and Mesa zeroed it. With an explicit initializer every compiler agrees.
#[test]
fn function_variables_have_initializers() {
    let mut bad = Vec::new();
    for (path, src) in shaders::FILES {
        for (i, line) in src.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            let t = code.trim_start();
            let indented = code.len() > t.len();
            if indented && t.starts_with("var ") && !t.starts_with("var<") && !t.contains('=') {
                bad.push(format!("{path}:{}: {}", i + 1, line.trim()));
            }
        }
    }
    assert!(
        bad.is_empty(),
        "function-scope vars without an initializer:\n{}",
        bad.join("\n")
    );
}

/// WGSL's grammar takes only unary expressions as the operands of `&`, `|`, `^`, `<<` and
/// `>>`, and never mixes `&&` with `||`, so `a >= b & c`, `a + b << c` or `x && y || z` need
/// parentheses. naga accepts them; browsers (Tint: "mixing '>=' and '&' requires
/// parenthesis") reject the shader. This scan finds such mixes at each parenthesis level of
/// every shader file: a level may hold a bitwise operator only with more of the same one, a
/// shift only with comparisons or logic around it, and one kind of short-circuit operator.
#[test]
fn operators_that_need_parentheses_have_them() {
    let mut bad = Vec::new();
    for (path, src) in shaders::FILES {
        let code: String = src
            .lines()
            .map(|l| l.split("//").next().unwrap_or(""))
            .collect::<Vec<_>>()
            .join("\n");
        for (line, ops) in mixed_levels(&code) {
            bad.push(format!("{path}:{line}: {}", ops.join(" ")));
        }
    }
    assert!(
        bad.is_empty(),
        "operators mixed without parentheses:\n{}",
        bad.join("\n")
    );
    // The scan itself: what it must find, and what it must leave.
    for (src, found) in [
        ("let x = a >= b & c;", true),
        ("let x = (a >= b) & (c != d);", false),
        ("let x = a + b << 2u;", true),
        ("let x = (a + b) << 2u;", false),
        ("let x = a << 2u == b;", false),
        ("let x = a & b | c;", true),
        ("let x = a & b & c;", false),
        ("let x = a && b || c;", true),
        ("let x = select(vec4<f32>(0.0), v, a < b) & m;", false),
        (
            "let p: ptr<function, array<vec4<u32>, 2>> = &arr; let y = -a * b;",
            false,
        ),
        ("if (x & 1u) == 0u && y > 2u { }", false),
        ("let z = f(a, b & c + d);", true),
    ] {
        assert_eq!(!mixed_levels(src).is_empty(), found, "{src}");
    }
}

/// The (line, operators) of each parenthesis level of WGSL `code` (comments removed) whose
/// binary operators WGSL does not let stand together.
fn mixed_levels(code: &str) -> Vec<(usize, Vec<String>)> {
    const TEMPLATED: [&str; 8] = [
        "vec2", "vec3", "vec4", "array", "ptr", "atomic", "bitcast", "var",
    ];
    let templated =
        |w: &str| TEMPLATED.contains(&w) || w.starts_with("mat") || w.starts_with("texture_");
    let b = code.as_bytes();
    let mut out = Vec::new();
    // Per level: the binary operators met since the level's last separator.
    let mut levels: Vec<Vec<String>> = vec![Vec::new()];
    let mut line = 1;
    let mut prev_operand = false; // whether the last token ends an operand
    let check = |ops: &mut Vec<String>, line: usize, out: &mut Vec<(usize, Vec<String>)>| {
        let has = |o: &str| ops.iter().any(|x| x == o);
        let bitwise: Vec<&str> = ["&", "|", "^"].into_iter().filter(|o| has(o)).collect();
        let shifts = ops.iter().filter(|o| *o == "<<" || *o == ">>").count();
        let arith = ["+", "-", "*", "/", "%"].iter().any(|o| has(o));
        let bad = (!bitwise.is_empty() && ops.iter().any(|o| o != bitwise[0]))
            || shifts > 1
            || (shifts == 1 && (arith || !bitwise.is_empty()))
            || (has("&&") && has("||"));
        if bad {
            out.push((line, ops.clone()));
        }
        ops.clear();
    };
    let mut i = 0;
    while i < b.len() {
        let c = b[i] as char;
        if c == '\n' {
            line += 1;
            i += 1;
            continue;
        }
        if c.is_whitespace() {
            i += 1;
            continue;
        }
        if c.is_ascii_alphanumeric() || c == '_' {
            let s = i;
            while i < b.len()
                && ((b[i] as char).is_ascii_alphanumeric() || b[i] == b'_' || b[i] == b'.')
            {
                i += 1;
            }
            let word = &code[s..i];
            // A template list right after a type or builtin name: skip it whole.
            if i < b.len() && b[i] == b'<' && templated(word) {
                let mut depth = 0;
                while i < b.len() {
                    match b[i] {
                        b'<' => depth += 1,
                        b'>' => {
                            depth -= 1;
                            if depth == 0 {
                                i += 1;
                                break;
                            }
                        }
                        _ => {}
                    }
                    i += 1;
                }
            }
            prev_operand = !matches!(
                word,
                "return" | "let" | "if" | "else" | "for" | "while" | "switch" | "case" | "loop"
            );
            continue;
        }
        let rest = &code[i..];
        let op = [
            "<<=", ">>=", "<<", ">>", "<=", ">=", "==", "!=", "&&", "||", "->", "+=", "-=", "*=",
            "/=", "%=", "&=", "|=", "^=", "++", "--",
        ]
        .into_iter()
        .find(|o| rest.starts_with(o))
        .unwrap_or(&rest[..1]);
        i += op.len();
        match op {
            "(" | "[" => {
                levels.push(Vec::new());
                prev_operand = false;
            }
            ")" | "]" => {
                let mut l = levels.pop().unwrap_or_default();
                check(&mut l, line, &mut out);
                if levels.is_empty() {
                    levels.push(Vec::new());
                }
                prev_operand = true;
            }
            "," | ";" | "{" | "}" | "=" | ":" | "->" | "@" | "+=" | "-=" | "*=" | "/=" | "%="
            | "&=" | "|=" | "^=" | "<<=" | ">>=" | "++" | "--" => {
                let l = levels.last_mut().unwrap();
                check(l, line, &mut out);
                prev_operand = matches!(op, "++" | "--");
            }
            "&" | "|" | "^" | "<<" | ">>" | "<" | ">" | "<=" | ">=" | "==" | "!=" | "&&" | "||"
            | "+" | "-" | "*" | "/" | "%" => {
                // After an operand it is binary; otherwise unary (-x, &x, *p).
                if prev_operand {
                    levels.last_mut().unwrap().push(op.to_string());
                }
                prev_operand = false;
            }
            _ => prev_operand = false,
        }
    }
    for mut l in levels {
        check(&mut l, line, &mut out);
    }
    out
}
