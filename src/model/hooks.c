/* The unit hooks as the model's code calls them: each tolerates NULL hooks
 * and NULL members (model.h hs_model_hooks). */
#include "model/internal.h"

void hs_hook_pre_forward(const hs_model_hooks *h, int u) {
    if (h && h->pre_forward) h->pre_forward(h->ctx, u);
}
void hs_hook_post_forward(const hs_model_hooks *h, int u) {
    if (h && h->post_forward) h->post_forward(h->ctx, u);
}
void hs_hook_pre_backward(const hs_model_hooks *h, int u) {
    if (h && h->pre_backward) h->pre_backward(h->ctx, u);
}
void hs_hook_post_backward(const hs_model_hooks *h, int u) {
    if (h && h->post_backward) h->post_backward(h->ctx, u);
}
void hs_hook_post_backward_final(const hs_model_hooks *h) {
    if (h && h->post_backward_final) h->post_backward_final(h->ctx);
}
void hs_hook_weight_grad_deferred(const hs_model_hooks *h, int u) {
    if (h && h->weight_grad_deferred) h->weight_grad_deferred(h->ctx, u);
}
void hs_hook_post_weight_grad(const hs_model_hooks *h, int u) {
    if (h && h->post_weight_grad) h->post_weight_grad(h->ctx, u);
}
