/*
bench_tp.cu: what tensor parallelism costs a layer kind on the GPUs (lm.cuh's TP over NCCL). One process per GPU:

  mpirun -np 2 build/bench_tp DESCRIPTOR B T [repeats]     (TP = the process count; one process: TP = 1)

Builds the one-layer model of DESCRIPTOR (its first layer's mixer and feed-forward are measured), runs a whole
forward and backward once to lay out its activations, then times each of these on layer 0 with CUDA events (3
warm-ups, the median of the repeats; rank 0's clock, the collectives keep the ranks in step):
  mixer forward + its output all-reduce, feed-forward forward + its all-reduce, mixer backward + its input-gradient
  all-reduce, feed-forward backward + its all-reduce, and the all-reduce of one (B,T,C) activation alone.
It counts the collectives each part issued (TPGroup.calls: the block's pair and the kind's own, RMSNormTP) and the
bytes one all-reduce of (B,T,C) moves per GPU: 2·(TP−1)/TP · B·T·C·sizeof(floatX) (ring reduce-scatter + all-gather).
Prints one markdown row per part: | GPU | descriptor | part | TP | ms | collectives | MB per all-reduce |.
*/
#define TESTING
#include "train_m2rnn.cu"
#include "dev/bench/bench_common.cuh"

int main(int argc, char **argv) {
    Comm comm;
    comm_init(&comm, &argc, &argv);
    if (argc < 4) {
        fail_with_hint("e.g. mpirun -np 2 build/bench_tp d1024:A:rope:h16 8 4096", "usage: bench_tp DESCRIPTOR B T [repeats]");
    }
    comm_set_layout(&comm, comm.world); // every process in one TP group
    const int B = atoi(argv[2]), T = atoi(argv[3]), repeats = argc > 4 ? atoi(argv[4]) : 20;
    ModelConfig config;
    memset(&config, 0, sizeof(config));
    config.vocab_size = 8192; // (the head is not measured here)
    config.m2rnn.grad_clamp = 1.0f;
    model_config_from_descriptor(&config, argv[1]);
    Model *model = model_create(&config);
    model_set_parallel(model, &comm);
    model_init_weights(model, 1);
    int *tokens = (int *)mallocCheck((size_t)(B * T + 1) * sizeof(int));
    Rng rng = {3};
    for (int i = 0; i <= B * T; i++) { tokens[i] = (int)(rng_next_u64(&rng) % config.vocab_size); }
    model_forward(model, tokens, tokens + 1, B, T);
    model_backward(model, 1.0f);
    cudaCheck(cudaDeviceSynchronize());

    const ModelConfig *c = &model->lc;
    const Runtime *rt = &model->rt;
    cudaStream_t stream = rt->stream;
    TPGroup *tp = model_tp_group(model);
    const size_t BTC = (size_t)B * T * c->d_model;
    LayerActs *la = &model->layer_acts[0];
    const ModelParamsLayer *w = &model->params.layers[0];
    const ModelParams32Layer *w32 = &model->master.layers[0], *g = &model->grads.layers[0];
    KindTensors tm = kind_tensors(w->mixer, w32->mixer, g->mixer), tf = kind_tensors(w->ffn, w32->ffn, g->ffn);
    tm.tp = tf.tp = tp;
    const KindOps *mx = model->mixer_ops[0], *ff = model->ffn_ops[0];
    struct Part { const char *name; int calls; float ms; } parts[5] = {
        {"mixer forward"}, {"feed-forward forward"}, {"mixer backward"}, {"feed-forward backward"}, {"all-reduce of (B,T,C)"}};
    for (int p = 0; p < 5; p++) {
        auto run = [&]() {
            switch (p) {
                case 0: mx->forward(model->branch_out, la->mixer, model->kind_scratch, la->ln1_out, &tm, c, B, T, rt); break;
                case 1: ff->forward(model->branch_out, la->ffn, model->kind_scratch, la->ln2_out, &tf, c, B, T, rt); break;
                case 2: mx->backward(model->d_norm, model->kind_scratch, model->d_resid, la->ln1_out, la->mixer, &tm, c, B, T, rt); break;
                case 3: ff->backward(model->d_norm, model->kind_scratch, model->d_resid, la->ln2_out, la->ffn, &tf, c, B, T, rt); break;
                default: break;
            }
            tp_sum(tp, p < 2 ? model->branch_out : model->d_norm, BTC, 0, stream); // the block's pair (p = 4: alone)
        };
        const long before = tp != NULL ? tp->calls : 0;
        run();
        parts[p].calls = (int)((tp != NULL ? tp->calls : 0) - before);
        parts[p].ms = median_ms(run, repeats, stream);
    }
    if (comm.rank == 0) {
        const double mb = comm.tp > 1 ? 2.0 * (comm.tp - 1) / comm.tp * BTC * sizeof(floatX) / 1e6 : 0.0;
        for (int p = 0; p < 5; p++) {
            printf("| %s | `%s` | %s | %d | %.3f | %d | %.1f |\n", model->rt.prop.name, argv[1], parts[p].name, comm.tp,
                   parts[p].ms, parts[p].calls, mb);
        }
    }
    model_free(model);
    free(tokens);
    comm_finalize(&comm);
    return 0;
}
