//! Code generation: the replacement of one statement, one runtime call per recognised
//! instruction (`mma.sync`, `ldmatrix`, `cp.async`).

use std::fmt::Write as _;

use super::statement::{Access, Operand, Statement};
use super::template::{instruction, template_tokens, Arg};
use super::{invalid, unsupported};
use crate::cpu::compile::CpuCompileError;

pub(super) struct Code {
    pub(super) text: String,
    pub(super) collective: bool,
}

/// The replacement of one statement.
pub(super) fn translate(stmt: &Statement, line: usize) -> Result<Code, CpuCompileError> {
    let mut text = String::from("do { ");
    for (i, op) in stmt.operands.iter().enumerate() {
        let _ = match op.access {
            Access::Read => write!(text, "const auto kevin_ptx_op{i} = ({}); ", op.expr),
            _ => write!(text, "auto& kevin_ptx_op{i} = ({}); ", op.expr),
        };
    }
    let mut collective = false;
    for toks in template_tokens(stmt, line)? {
        let (opcode, args) = instruction(&toks)?;
        let gen = Gen {
            ops: &stmt.operands,
            line,
            opcode: &opcode,
        };
        let parts: Vec<&str> = opcode.split('.').collect();
        let (code, warp) = match parts[..] {
            ["mma", ..] => (gen.mma(&parts, &args)?, true),
            ["ldmatrix", ..] => (gen.ldmatrix(&parts, &args)?, true),
            ["cp", "async", ..] => (gen.cp_async(&parts[2..], &args)?, false),
            _ => return Err(unsupported(format!("`{opcode}`"))),
        };
        text.push_str(&code);
        text.push(' ');
        collective |= warp;
    }
    text.push_str("} while (0)");
    Ok(Code { text, collective })
}

/// Generates the code of one recognised instruction.
struct Gen<'a> {
    ops: &'a [Operand],
    line: usize,
    opcode: &'a str,
}

impl Gen<'_> {
    fn invalid(&self, what: impl std::fmt::Display) -> CpuCompileError {
        invalid(self.line, format!("`{}`: {what}", self.opcode))
    }

    fn unsupported(&self) -> CpuCompileError {
        unsupported(format!("`{}`", self.opcode))
    }

    /// The operand whose value reading `%i` gives: itself, or the input tied to a write-only
    /// output (an untied one has no value).
    fn source(&self, i: usize) -> Result<usize, CpuCompileError> {
        let op = &self.ops[i];
        if op.access != Access::Write {
            return Ok(i);
        }
        match op.tied {
            Some(j) => Ok(j),
            None => Err(unsupported(format!(
                "`{}` reading its write-only output %{i}",
                self.opcode
            ))),
        }
    }

    /// The value of a 32-bit register operand.
    fn read32(&self, i: usize) -> Result<String, CpuCompileError> {
        let src = self.source(i)?;
        let letter = self.ops[src].letter;
        if !matches!(letter, 'r' | 'f') {
            return Err(self.invalid(format!(
                "operand %{i} has constraint \"{letter}\" where a 32-bit register (\"r\" or \"f\") is needed"
            )));
        }
        Ok(format!("::kevin::ptx_b32(kevin_ptx_op{src})"))
    }

    /// The binding an instruction writes a 32-bit register to.
    fn write32(&self, i: usize) -> Result<String, CpuCompileError> {
        let op = &self.ops[i];
        if op.access == Access::Read {
            return Err(unsupported(format!(
                "`{}` writing its input operand %{i}",
                self.opcode
            )));
        }
        if !matches!(op.letter, 'r' | 'f') {
            return Err(self.invalid(format!(
                "output %{i} has constraint \"{}\" where a 32-bit register (\"r\" or \"f\") is needed",
                op.letter
            )));
        }
        Ok(format!("kevin_ptx_op{i}"))
    }

    /// The registers of a vector operand of `n` elements (a bare register when `n` is 1).
    fn vector(&self, arg: &Arg, n: usize, what: &str) -> Result<Vec<usize>, CpuCompileError> {
        match arg {
            Arg::Vec(regs) if regs.len() == n => Ok(regs.clone()),
            Arg::Reg(r) if n == 1 => Ok(vec![*r]),
            _ => Err(self.invalid(format!("{what} must be a vector of {n} registers"))),
        }
    }

    /// The address `[%r + offset]` as a `uint64_t` expression; `global` needs a 64-bit operand.
    fn address(&self, arg: &Arg, global: bool, what: &str) -> Result<String, CpuCompileError> {
        let Arg::Addr { reg, offset } = arg else {
            return Err(self.invalid(format!("{what} must be an address `[%N]` or `[%N+imm]`")));
        };
        let src = self.source(*reg)?;
        let b = format!("kevin_ptx_op{src}");
        match self.ops[src].letter {
            'l' => Ok(format!("(::kevin::ptx_b64({b}) + uint64_t({offset}ll))")),
            'r' if !global => Ok(format!(
                "uint64_t(uint32_t(::kevin::ptx_b32({b}) + uint32_t({offset}ll)))"
            )),
            c => Err(self.invalid(format!(
                "{what} operand %{reg} has constraint \"{c}\"; an address needs {}",
                if global { "\"l\"" } else { "\"r\" or \"l\"" }
            ))),
        }
    }

    /// An integer: an immediate, an `n`/`i` operand, or (when `register`) an `r` operand.
    fn integer(&self, arg: &Arg, register: bool, what: &str) -> Result<String, CpuCompileError> {
        match arg {
            Arg::Imm(n) => Ok(format!("uint64_t({n}ll)")),
            Arg::Reg(i) => {
                let src = self.source(*i)?;
                match self.ops[src].letter {
                    'n' | 'i' => Ok(format!("::kevin::ptx_b64(kevin_ptx_op{src})")),
                    'r' if register => Ok(format!("uint64_t({})", self.read32(*i)?)),
                    c => Err(self.invalid(format!("{what} operand %{i} has constraint \"{c}\""))),
                }
            }
            _ => Err(self.invalid(format!(
                "{what} must be {}",
                if register {
                    "an integer"
                } else {
                    "an immediate"
                }
            ))),
        }
    }

    fn count(&self, args: &[Arg], n: &[usize]) -> Result<(), CpuCompileError> {
        if n.contains(&args.len()) {
            return Ok(());
        }
        let want: Vec<String> = n.iter().map(usize::to_string).collect();
        Err(self.invalid(format!(
            "takes {} operands, found {}",
            want.join(" or "),
            args.len()
        )))
    }

    /// Ends the block `s` that filled `kevin_ptx_d`: copies each element to its destination
    /// register (`dregs`, in order) and closes the brace.
    fn close_with_outputs(
        &self,
        mut s: String,
        dregs: &[usize],
    ) -> Result<String, CpuCompileError> {
        for (i, &r) in dregs.iter().enumerate() {
            let _ = write!(
                s,
                " ::kevin::ptx_set({}, kevin_ptx_d[{i}]);",
                self.write32(r)?
            );
        }
        s.push_str(" }");
        Ok(s)
    }

    /// `mma.sync.aligned.m16n8k{8,16}.row.col.dtype.atype.btype.ctype D, A, B, C`.
    fn mma(&self, parts: &[&str], args: &[Arg]) -> Result<String, CpuCompileError> {
        let ["mma", "sync", "aligned", shape, "row", "col", d, a, b, c] = parts[..] else {
            return Err(self.unsupported());
        };
        let k = match shape {
            "m16n8k16" => 16,
            "m16n8k8" => 8,
            _ => return Err(self.unsupported()),
        };
        let ty = |t: &str| match t {
            "f16" => Some("::kevin::PTX_F16"),
            "bf16" => Some("::kevin::PTX_BF16"),
            "f32" => Some("::kevin::PTX_F32"),
            _ => None,
        };
        let accumulators_ok = match a {
            "bf16" => d == "f32" && c == "f32",
            "f16" => matches!(d, "f16" | "f32") && matches!(c, "f16" | "f32"),
            _ => false,
        };
        if a != b || !accumulators_ok {
            return Err(self.unsupported());
        }
        let (Some(ab), Some(ct), Some(dt)) = (ty(a), ty(c), ty(d)) else {
            return Err(self.unsupported());
        };
        self.count(args, &[4])?;
        let width = |t: &str| if t == "f32" { 4 } else { 2 };
        let dregs = self.vector(&args[0], width(d), "D")?;
        let aregs = self.vector(&args[1], k / 4, "A")?;
        let bregs = self.vector(&args[2], k / 8, "B")?;
        let cregs = self.vector(&args[3], width(c), "C")?;
        let values = |regs: &[usize]| -> Result<String, CpuCompileError> {
            let v: Result<Vec<String>, _> = regs.iter().map(|&r| self.read32(r)).collect();
            Ok(v?.join(", "))
        };
        let s = format!(
            "{{ const uint32_t kevin_ptx_a[{}] = {{{}}}; const uint32_t kevin_ptx_b[{}] = {{{}}}; \
             const uint32_t kevin_ptx_c[{}] = {{{}}}; uint32_t kevin_ptx_d[{}]; \
             ::kevin::ptx_mma({k}, {ab}, {ct}, {dt}, kevin_ptx_a, kevin_ptx_b, kevin_ptx_c, kevin_ptx_d);",
            aregs.len(),
            values(&aregs)?,
            bregs.len(),
            values(&bregs)?,
            cregs.len(),
            values(&cregs)?,
            dregs.len(),
        );
        self.close_with_outputs(s, &dregs)
    }

    /// `ldmatrix.sync.aligned.m8n8.{x1,x2,x4}{.trans}{.shared{::cta}}.b16 D, [addr]`.
    fn ldmatrix(&self, parts: &[&str], args: &[Arg]) -> Result<String, CpuCompileError> {
        let ["ldmatrix", "sync", "aligned", ref quals @ ..] = parts[..] else {
            return Err(self.unsupported());
        };
        // The ISA writes `.m8n8.x4.trans.shared.b16`; ptxas takes the qualifiers in any order,
        // and CUTLASS writes `.x4.trans.m8n8.shared.b16`.
        let has = |q: &[&str]| quals.iter().filter(|x| q.contains(x)).count();
        let n = match (has(&["x1"]), has(&["x2"]), has(&["x4"])) {
            (1, 0, 0) => 1,
            (0, 1, 0) => 2,
            (0, 0, 1) => 4,
            _ => return Err(self.unsupported()),
        };
        let (trans, shared) = (has(&["trans"]), has(&["shared", "shared::cta"]));
        if has(&["m8n8"]) != 1 || has(&["b16"]) != 1 || trans > 1 || shared > 1 {
            return Err(self.unsupported());
        }
        if quals.len() != 3 + trans + shared {
            return Err(self.unsupported());
        }
        let (trans, shared) = (trans == 1, shared == 1);
        self.count(args, &[2])?;
        let dregs = self.vector(&args[0], n, "the destination")?;
        let addr = self.address(&args[1], false, "the row address")?;
        let s = format!(
            "{{ uint32_t kevin_ptx_d[{n}]; ::kevin::ptx_ldmatrix({n}, {trans}, {shared}, {addr}, kevin_ptx_d);"
        );
        self.close_with_outputs(s, &dregs)
    }

    /// `cp.async.{ca,cg}.shared{::cta}.global{.L2::cache_hint}{.L2::NB} [dst], [src], cp-size
    /// {, src-size}{, cache-policy}`, `cp.async.commit_group`, `.wait_group N`, `.wait_all`.
    fn cp_async(&self, parts: &[&str], args: &[Arg]) -> Result<String, CpuCompileError> {
        match parts {
            ["commit_group"] => {
                self.count(args, &[0])?;
                return Ok("::kevin::ptx_cp_async_commit_group();".into());
            }
            ["wait_all"] => {
                self.count(args, &[0])?;
                return Ok("::kevin::ptx_cp_async_wait_all();".into());
            }
            ["wait_group"] => {
                self.count(args, &[1])?;
                let n = self.integer(&args[0], false, "the group count")?;
                return Ok(format!("::kevin::ptx_cp_async_wait_group({n});"));
            }
            _ => {}
        }
        let [cop @ ("ca" | "cg"), "shared" | "shared::cta", "global", ref quals @ ..] = parts[..]
        else {
            return Err(self.unsupported());
        };
        let hint = quals.contains(&"L2::cache_hint");
        let prefetch = quals
            .iter()
            .filter(|q| matches!(**q, "L2::64B" | "L2::128B" | "L2::256B"))
            .count();
        if prefetch > 1 || quals.len() != prefetch + usize::from(hint) {
            return Err(self.unsupported());
        }
        let extra = usize::from(hint);
        self.count(args, &[3 + extra, 4 + extra])?;
        let dst = self.address(&args[0], false, "the destination")?;
        let src = self.address(&args[1], true, "the source")?;
        let cp_size = self.integer(&args[2], false, "cp-size")?;
        let src_size = if args.len() == 4 + extra {
            self.integer(&args[3], true, "src-size")?
        } else {
            cp_size.clone()
        };
        if hint {
            // The cache policy only steers L2; it must still be a 64-bit operand.
            match args.last() {
                Some(Arg::Reg(i)) if self.ops[self.source(*i)?].letter == 'l' => {}
                _ => return Err(self.invalid("the cache policy must be a 64-bit (\"l\") operand")),
            }
        }
        Ok(format!(
            "::kevin::ptx_cp_async({}, {dst}, {src}, {cp_size}, {src_size});",
            cop == "cg"
        ))
    }
}
