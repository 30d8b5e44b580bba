//! The RL math of the recipe, as plain scalar functions.
//!
//! Everything the learner optimises is defined here once, in f64, with no tensor library: turn
//! scores, discounted turn returns, group advantages, the staleness rule, the clipped surrogate
//! with clip-higher, the decoupled off-policy objective and Dr. GRPO's constant normalisation.
//! The burn learner computes the same quantities on tensors and is tested against these
//! functions, which are in turn tested against hand-computed values (the trusted reference beside
//! the fast path).

use serde::{Deserialize, Serialize};

/// Bonus for a correct kernel in the turn score, before its speedup is added (the paper's 0.3).
pub const CORRECTNESS_BONUS: f64 = 0.3;

/// The largest speedup a turn's score counts (the threshold above which an outcome is flagged,
/// [`crate::outcome::SUSPICIOUS_SPEEDUP`]). A faster correct kernel scores as one at this speedup:
/// such speedups are more often a hole in the harness or a task whose output barely depends on
/// an input than a real win, and one of them would otherwise outweigh a whole group's honest
/// kernels in the advantages (a kernel that ignored an input was judged correct at 55x on
/// 2026-12-07). The measured speedup is still reported and flagged.
pub const MAX_SCORED_SPEEDUP: f64 = 10.0;

/// Turn score S = 0.3 * 1[correct] + min(speedup, [`MAX_SCORED_SPEEDUP`]) * 1[correct].
///
/// `speedup` is T_baseline / T_kernel; it is ignored for an incorrect kernel, so a wrong kernel
/// scores exactly 0 however fast it was.
pub fn turn_score(correct: bool, speedup: f64) -> f64 {
    if correct && speedup.is_finite() && speedup >= 0.0 {
        CORRECTNESS_BONUS + speedup.min(MAX_SCORED_SPEEDUP)
    } else if correct {
        // A correct kernel with a meaningless timing still earns the correctness bonus.
        CORRECTNESS_BONUS
    } else {
        0.0
    }
}

/// What a turn is credited with before its return is discounted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TurnCredit {
    /// The turn's own score (the paper's): a kernel resubmitted unchanged scores again.
    Score,
    /// What the turn adds over the best score before it in its trajectory,
    /// max(0, S_t - max over i < t of S_i): a repeated kernel earns nothing the second time, a
    /// repair its whole score, a faster kernel the difference.
    Improvement,
    /// The same difference without the floor at 0, S_t - max over i < t of S_i: as
    /// `Improvement`, and a turn that breaks or slows a kernel its trajectory already had loses
    /// what it lost. Under `Improvement` such a turn earns what a repeat earns (nothing), so
    /// nothing stops a policy from breaking its own right kernels when it rewrites them.
    Gain,
}

/// Each turn's credit from the trajectory's scores (`scores[i]`: turn i's; same length).
pub fn turn_credits(scores: &[f64], credit: TurnCredit) -> Vec<f64> {
    match credit {
        TurnCredit::Score => scores.to_vec(),
        TurnCredit::Improvement | TurnCredit::Gain => {
            let floor = if credit == TurnCredit::Improvement {
                0.0
            } else {
                f64::NEG_INFINITY
            };
            let mut best = 0.0_f64;
            scores
                .iter()
                .map(|&s| {
                    let gain = (s - best).max(floor);
                    best = best.max(s);
                    gain
                })
                .collect()
        }
    }
}

/// How the scores of later turns enter a turn's return.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReturnAggregation {
    /// R_t = sum over i >= t of gamma^(i-t) * S_i (the paper's default).
    Sum,
    /// R_t = max over i >= t of gamma^(i-t) * S_i: credit for the best kernel the turn led to.
    Max,
}

/// Discounted return of every turn of one trajectory.
///
/// `scores[i]` is turn i's score; the result has the same length.
pub fn turn_returns(scores: &[f64], gamma: f64, aggregation: ReturnAggregation) -> Vec<f64> {
    let mut returns = vec![0.0; scores.len()];
    let mut running: f64 = 0.0;
    for (i, &s) in scores.iter().enumerate().rev() {
        let carried = gamma * running;
        running = match aggregation {
            ReturnAggregation::Sum => s + carried,
            // The last turn carries nothing, so its return is its own score.
            ReturnAggregation::Max if i + 1 == scores.len() => s,
            ReturnAggregation::Max => s.max(carried),
        };
        returns[i] = running;
    }
    returns
}

/// Added to the standard deviation before dividing, so a group whose returns are all equal gets
/// zero advantages instead of NaN.
pub const ADVANTAGE_EPS: f64 = 1e-6;

/// Advantages of all m*n turn-samples of one task: return minus the group mean, optionally divided
/// by the group's (population) standard deviation.
pub fn group_advantages(returns: &[f64], std_normalize: bool) -> Vec<f64> {
    if returns.is_empty() {
        return Vec::new();
    }
    let n = returns.len() as f64;
    let mean = returns.iter().sum::<f64>() / n;
    let centred: Vec<f64> = returns.iter().map(|r| r - mean).collect();
    if !std_normalize {
        return centred;
    }
    let std = (centred.iter().map(|c| c * c).sum::<f64>() / n).sqrt();
    centred.iter().map(|c| c / (std + ADVANTAGE_EPS)).collect()
}

/// The staleness rule: a group is stale when its oldest turn was sampled by a policy more than
/// `max_staleness` learner versions behind `learner_version`.
pub fn is_stale(oldest_policy_version: u64, learner_version: u64, max_staleness: u64) -> bool {
    learner_version.saturating_sub(oldest_policy_version) > max_staleness
}

/// The asymmetric clip range of clip-higher (DAPO): ratios are kept in
/// [1 - eps_low, 1 + eps_high].
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Clip {
    /// Lower clip offset (0.2 in the recipe).
    pub eps_low: f64,
    /// Upper clip offset (0.28 in the recipe): larger, so unlikely tokens can still gain mass.
    pub eps_high: f64,
}

impl Default for Clip {
    fn default() -> Self {
        Clip {
            eps_low: 0.2,
            eps_high: 0.28,
        }
    }
}

/// One token's loss under the clipped surrogate, and whether clipping took the gradient away.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TokenLoss {
    /// The loss: minus the clipped objective, times the importance weight where there is one.
    pub loss: f64,
    /// True when the clipped branch was chosen and it is constant in the policy's log-prob, so
    /// the token contributes no gradient.
    pub clipped: bool,
}

fn clipped_objective(ratio: f64, advantage: f64, clip: Clip) -> (f64, bool) {
    let clipped_ratio = ratio.clamp(1.0 - clip.eps_low, 1.0 + clip.eps_high);
    let unclipped = ratio * advantage;
    let clipped = clipped_ratio * advantage;
    if clipped < unclipped {
        (clipped, clipped_ratio != ratio)
    } else {
        (unclipped, false)
    }
}

/// PPO/GRPO clipped surrogate for one token against the behaviour policy:
/// loss = -min(r * A, clip(r, 1 - eps_low, 1 + eps_high) * A), r = exp(logp_new - logp_behaviour).
pub fn clipped_surrogate(
    logp_new: f64,
    logp_behaviour: f64,
    advantage: f64,
    clip: Clip,
) -> TokenLoss {
    let ratio = (logp_new - logp_behaviour).exp();
    let (objective, clipped) = clipped_objective(ratio, advantage, clip);
    TokenLoss {
        loss: -objective,
        clipped,
    }
}

/// The decoupled off-policy objective for one token: the ratio is clipped against a proximal
/// policy (the learner's weights at the start of this batch) and the whole term is weighted by
/// pi_prox / pi_behaviour, capped at `weight_cap` (5 in the recipe) so one very stale token
/// cannot dominate the batch.
pub fn decoupled_surrogate(
    logp_new: f64,
    logp_prox: f64,
    logp_behaviour: f64,
    advantage: f64,
    clip: Clip,
    weight_cap: f64,
) -> TokenLoss {
    let ratio = (logp_new - logp_prox).exp();
    let weight = (logp_prox - logp_behaviour).exp().min(weight_cap);
    let (objective, clipped) = clipped_objective(ratio, advantage, clip);
    TokenLoss {
        loss: -weight * objective,
        clipped,
    }
}

/// Dr. GRPO's constant normaliser: the summed token losses of a batch are divided by
/// `max_tokens * samples`, not by each response's own length, so long and short responses
/// weigh the same per token and no length bias creeps in.
pub fn drgrpo_normalizer(max_tokens: usize, samples: usize) -> f64 {
    (max_tokens.max(1) * samples.max(1)) as f64
}

/// Batch loss with constant normalisation: the sum of every token loss of every sample divided by
/// [`drgrpo_normalizer`].
pub fn drgrpo_loss(per_sample_token_losses: &[Vec<f64>], max_tokens: usize) -> f64 {
    let total: f64 = per_sample_token_losses.iter().flatten().sum();
    total / drgrpo_normalizer(max_tokens, per_sample_token_losses.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    fn check_returns(scores: &[f64], gamma: f64, agg: ReturnAggregation, expected: &[f64]) {
        let got = turn_returns(scores, gamma, agg);
        assert_eq!(got.len(), expected.len());
        for (g, e) in got.iter().zip(expected) {
            assert!(
                close(*g, *e),
                "scores {scores:?}: got {got:?}, expected {expected:?}"
            );
        }
    }

    #[test]
    fn turn_score_follows_the_paper() {
        assert!(close(turn_score(false, 5.0), 0.0));
        assert!(close(turn_score(true, 1.0), 1.3));
        assert!(close(turn_score(true, 0.5), 0.8));
        assert!(close(turn_score(true, f64::NAN), 0.3));
    }

    #[test]
    fn a_flagged_speedup_scores_as_the_flag_threshold() {
        assert!(close(turn_score(true, 55.0), 10.3));
        assert!(close(turn_score(true, MAX_SCORED_SPEEDUP), 10.3));
        assert!(close(turn_score(true, 9.5), 9.8));
        assert!(close(turn_score(false, 55.0), 0.0));
    }

    #[test]
    fn four_turn_sum_returns_with_gamma_0_4() {
        // Scores of a 4-turn trajectory: correct at 1x, correct at 1x... by hand:
        // R3 = 2.3
        // R2 = 0   + 0.4 * 2.3   = 0.92
        // R1 = 1.3 + 0.4 * 0.92  = 1.668
        // R0 = 0.3 + 0.4 * 1.668 = 0.9672
        check_returns(
            &[0.3, 1.3, 0.0, 2.3],
            0.4,
            ReturnAggregation::Sum,
            &[0.9672, 1.668, 0.92, 2.3],
        );
    }

    #[test]
    fn improvement_credits_only_what_a_turn_adds() {
        // wrong, correct 1x, the same again, faster (2x), slower (0.5x), wrong.
        let scores = [0.0, 1.3, 1.3, 2.3, 0.8, 0.0];
        assert_eq!(turn_credits(&scores, TurnCredit::Score), scores.to_vec());
        let got = turn_credits(&scores, TurnCredit::Improvement);
        let expected = [0.0, 1.3, 0.0, 1.0, 0.0, 0.0];
        assert!(
            got.iter().zip(&expected).all(|(g, e)| close(*g, *e)),
            "{got:?}"
        );
        assert!(turn_credits(&[], TurnCredit::Improvement).is_empty());
        // Gain: the same, but the slower kernel and the broken one lose what they lost.
        let got = turn_credits(&scores, TurnCredit::Gain);
        let expected = [0.0, 1.3, 0.0, 1.0, -1.5, -2.3];
        assert!(
            got.iter().zip(&expected).all(|(g, e)| close(*g, *e)),
            "{got:?}"
        );
        // A failed first turn is not a loss: nothing was had before it.
        assert!(close(turn_credits(&[0.0, 0.0], TurnCredit::Gain)[1], 0.0));
    }

    #[test]
    fn four_turn_max_returns_with_gamma_0_4() {
        // R3 = 2.3; R2 = max(0, 0.92) = 0.92; R1 = max(1.3, 0.368) = 1.3; R0 = max(0.3, 0.52) = 0.52
        check_returns(
            &[0.3, 1.3, 0.0, 2.3],
            0.4,
            ReturnAggregation::Max,
            &[0.52, 1.3, 0.92, 2.3],
        );
    }

    #[test]
    fn returns_edge_cases() {
        check_returns(&[], 0.4, ReturnAggregation::Sum, &[]);
        check_returns(&[1.0], 0.4, ReturnAggregation::Max, &[1.0]);
        check_returns(&[1.0, 2.0], 0.0, ReturnAggregation::Sum, &[1.0, 2.0]);
        check_returns(&[1.0, 2.0], 1.0, ReturnAggregation::Sum, &[3.0, 2.0]);
    }

    #[test]
    fn advantages_centre_and_optionally_scale() {
        let a = group_advantages(&[1.0, 2.0, 3.0, 6.0], false);
        // mean 3
        assert_eq!(a, vec![-2.0, -1.0, 0.0, 3.0]);
        let s = group_advantages(&[1.0, 2.0, 3.0, 6.0], true);
        // population variance (4 + 1 + 0 + 9) / 4 = 3.5
        let std = 3.5f64.sqrt();
        for (got, c) in s.iter().zip([-2.0, -1.0, 0.0, 3.0]) {
            assert!((got - c / (std + ADVANTAGE_EPS)).abs() < 1e-12);
        }
        assert!(
            group_advantages(&[0.7, 0.7, 0.7], true)
                .iter()
                .all(|a| a.abs() < 1e-9),
            "equal returns: no signal"
        );
        assert!(group_advantages(&[], true).is_empty());
    }

    #[test]
    fn staleness_rule() {
        assert!(!is_stale(5, 5, 0));
        assert!(is_stale(4, 5, 0));
        assert!(!is_stale(3, 5, 2));
        assert!(is_stale(2, 5, 2));
        // A group from a newer policy than the learner (after a restart) is never stale.
        assert!(!is_stale(7, 5, 0));
    }

    #[test]
    fn clipped_surrogate_hand_values() {
        let clip = Clip::default();
        // Ratio 1: loss = -A.
        let l = clipped_surrogate(-1.0, -1.0, 2.0, clip);
        assert!(close(l.loss, -2.0) && !l.clipped);
        // Ratio 1.5, A > 0: clipped at 1.28 -> loss = -1.28 * 2.
        let l = clipped_surrogate(1.5f64.ln(), 0.0, 2.0, clip);
        assert!(close(l.loss, -2.56) && l.clipped);
        // Ratio 1.5, A < 0: min picks the unclipped 1.5 * -2 = -3 -> loss 3, gradient kept.
        let l = clipped_surrogate(1.5f64.ln(), 0.0, -2.0, clip);
        assert!(close(l.loss, 3.0) && !l.clipped);
        // Ratio 0.5, A < 0: clipped at 0.8 -> loss = 0.8 * 2 = 1.6.
        let l = clipped_surrogate(0.5f64.ln(), 0.0, -2.0, clip);
        assert!(close(l.loss, 1.6) && l.clipped);
        // Ratio 0.5, A > 0: unclipped 0.5 * 2 = 1 -> loss -1.
        let l = clipped_surrogate(0.5f64.ln(), 0.0, 2.0, clip);
        assert!(close(l.loss, -1.0) && !l.clipped);
        // Clip-higher: a ratio of 1.25 is inside [0.8, 1.28], so not clipped.
        let l = clipped_surrogate(1.25f64.ln(), 0.0, 1.0, clip);
        assert!(close(l.loss, -1.25) && !l.clipped);
    }

    #[test]
    fn decoupled_surrogate_hand_values() {
        let clip = Clip::default();
        // pi_new = pi_prox: ratio 1; weight = exp(prox - behaviour) = 2 -> loss = -2 * A.
        let l = decoupled_surrogate(0.0, 0.0, -(2.0f64.ln()), 1.5, clip, 5.0);
        assert!(close(l.loss, -3.0));
        // Weight capped at 5 although pi_prox / pi_behaviour = 10.
        let l = decoupled_surrogate(0.0, 0.0, -(10.0f64.ln()), 1.0, clip, 5.0);
        assert!(close(l.loss, -5.0));
        // Ratio against prox 1.5 with A > 0 is clipped at 1.28, weight 1.
        let l = decoupled_surrogate(1.5f64.ln(), 0.0, 0.0, 1.0, clip, 5.0);
        assert!(close(l.loss, -1.28) && l.clipped);
    }

    #[test]
    fn drgrpo_normalises_by_a_constant() {
        // Two samples, max_tokens 4: (1 + 2 + 3) / (4 * 2) = 0.75 whatever the lengths are.
        let loss = drgrpo_loss(&[vec![1.0, 2.0], vec![3.0]], 4);
        assert!(close(loss, 0.75));
        assert!(close(drgrpo_normalizer(1024, 16), 16384.0));
        assert!(close(drgrpo_loss(&[], 4), 0.0));
    }
}
